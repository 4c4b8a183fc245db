"""The rule for an FSDP root unit, shared by the shard step (shard.py) and SDP's sharded mode; torch-free (the
layouts' cost reads it).

The root holds what is outside the repeated blocks (embeddings, final norm, head). Backward needs it
first, so FSDP2 keeps a root's gathered parameters from forward into backward (its default for a
root); an explicit `reshard_after_forward=True` would free them and gather them again at once.
"""

from __future__ import annotations


def root_reshard_after_forward(reshard_after_forward: bool) -> bool | None:
    """The root's `fully_shard(reshard_after_forward=...)` for the spec's `parallel.reshard_after_forward`."""
    return None if reshard_after_forward else False


def gathered_per_micro_batch(units: float, root: float, reshard_after_forward: bool) -> float:
    """Parameters all-gathered per micro-batch: every unit for forward, the blocks again for backward
    when they reshard after forward (the root stays gathered). `units`: all of them, root included."""
    return 2 * units - root if reshard_after_forward else units
