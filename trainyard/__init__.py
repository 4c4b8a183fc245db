"""Trainyard's session API for your own training loop (`program:` in a job spec).

    import trainyard

    for step in range(start, steps):
        ...
        trainyard.report({"loss": loss.item(), "samples_per_s": rate}, step=step)
        if trainyard.should_stop():      # cancelled or preempted: save and return
            save(trainyard.checkpoint_dir()); break

Every call also works outside Trainyard (plain `torchrun`, a laptop): `report` does nothing,
`should_stop` is False, the checkpoint directory is `./checkpoints`, rank and world size come
from torchrun's environment. This package imports nothing of Trainyard's and only the standard
library (torch only for `mesh()`, fsspec only for checkpoints on an object store).
"""

from trainyard.checkpoints import latest_checkpoint_in
from trainyard.session import checkpoint_dir, latest_checkpoint, mesh, rank, report, should_stop, world_size

__all__ = ["checkpoint_dir", "latest_checkpoint", "latest_checkpoint_in", "mesh", "rank", "report",
           "should_stop", "world_size"]
