"""What to do at a durable checkpoint: re-split the pipeline, regrow, or move a straggler.

A checkpoint every rank has written is the cheapest moment to restart the group on another
layout or placement; at most one change is made, in this order of precedence.
"""

from __future__ import annotations

from dataclasses import dataclass

from service.supervisor.outcome import Outcome
from workers.spec import JobSpec


@dataclass(frozen=True)
class CheckpointStatus:
    step: int  # the durable checkpoint
    resplit: JobSpec | None = None  # the pipeline re-split planned, if any (taken only when not regrowing)
    resplit_reason: str = ""
    grow_to: JobSpec | None = None  # a larger layout the cluster has room for, if any
    replace: tuple[int, str] | None = None  # (rank, node) the replace policy planned to move


def on_durable_checkpoint(status: CheckpointStatus) -> Outcome | None:
    if status.resplit is not None:
        return Outcome.resize(status.resplit_reason, status.resplit)
    if status.grow_to is not None:
        return Outcome.resize(f"capacity for {status.grow_to.world_size} workers returned; "
                              f"regrowing from the checkpoint at step {status.step}", status.grow_to)
    if status.replace is not None:
        rank, node = status.replace
        return Outcome.resize(f"moving straggler rank {rank} off node {node[:12]} from the checkpoint at step "
                              f"{status.step}", move=(rank, node))
    return None
