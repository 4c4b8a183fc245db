"""Checkpoints of the same model on the local disk and on an S3 server, through the Trainer's own
Checkpointer (workers/checkpointing: DCP async save; on an object store staged locally and uploaded).

    .venv/bin/python bench/storage.py [--reps 5] [--d-model 256] [--layers 4]

One process, a gloo group of one (a rank's checkpoint group), a GPT with AdamW state. Per save, the
median of --reps, local and S3 interleaved:
  - blocked: the training loop's wait in Checkpointer.save (DCP copies the state before returning);
  - durable: save start -> Checkpointer.wait() returns (complete on the storage: .metadata and every shard);
  - restore: load_checkpoint into a fresh model and optimiser (on S3: read from the store).
The S3 server is moto's on loopback: it measures the protocol's and the client's costs, not a network.
Time to recovery after a node loss on each storage is not in this table (see the closing note of issue 20).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from bench.checkpoint_store import model_and_optimizer, print_save_table  # noqa: E402
from tests.live import free_port  # noqa: E402
from tests.s3_server import S3Server  # noqa: E402
from workers.checkpointing import Checkpointer, latest_checkpoint, load_checkpoint  # noqa: E402
from workers.storage import Storage  # noqa: E402


def one_save(job: Storage, d_model: int, layers: int) -> dict[str, float]:
    model, optimizer = model_and_optimizer(d_model, layers)
    checkpointer = Checkpointer(job, keep=2, rank=0)
    t0 = time.perf_counter()
    checkpointer.save(model, optimizer, 1)
    blocked = time.perf_counter() - t0
    checkpointer.wait()
    durable = time.perf_counter() - t0
    latest = latest_checkpoint(job)
    assert latest is not None and latest[0] == 1, f"{job.uri}: the checkpoint is not complete"
    fresh_model, fresh_opt = model_and_optimizer(d_model, layers)
    t1 = time.perf_counter()
    load_checkpoint(latest[1], fresh_model, fresh_opt)
    restore = time.perf_counter() - t1
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh_model.state_dict().values()))
    return {"blocked": blocked, "durable": durable, "restore": restore}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results: dict[str, dict[str, list[float]]] = {"local": {}, "s3": {}}
    with tempfile.TemporaryDirectory(prefix="bench-storage-") as tmpdir:
        tmp = Path(tmpdir)
        server = S3Server(tmp / "s3").start()
        os.environ.update(server.env)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
        try:
            for rep in range(args.reps):
                for where in ("local", "s3") if rep % 2 == 0 else ("s3", "local"):  # interleaved
                    job = (Storage.at(tmp / f"local-{rep}" / "jobs" / "j") if where == "local" else
                           Storage.at(server.create_bucket(f"bench-{uuid.uuid4().hex[:8]}") + "/jobs/j"))
                    for key, value in one_save(job, args.d_model, args.layers).items():
                        results[where].setdefault(key, []).append(value)
        finally:
            dist.destroy_process_group()
            server.stop()
    model, _ = model_and_optimizer(args.d_model, args.layers)
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values()) * 3  # params + 2 Adam
    print_save_table(results, args, nbytes, {"local": "local disk", "s3": "S3 (moto, loopback)"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
