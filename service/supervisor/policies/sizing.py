"""Elastic sizing: the layout a job runs on for the worker slots the cluster can give it.

The global batch is kept, so a job resharded to fewer workers trains the same problem
with more gradient accumulation per rank. Model-parallel degrees (tp, pp, cp) are kept when
the new world size allows it, otherwise dropped, and expert parallelism shrinks to what the new
data-parallel degree holds (DCP reshards the checkpoint onto whatever layout results). How many
slots are free is the caller's question (service/supervisor/cluster.py); these functions only decide.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum

from workers.parallel.layouts import layout_errors
from workers.spec import JobSpec, Violation
from workers.spec.rules import degree_violations


def relayout(spec: JobSpec, workers: int) -> JobSpec | None:
    """`spec` laid out on `workers` ranks with the same global batch, or None if no layout fits. The
    candidates are the dims arithmetic's (workers/spec/dims.py); only what a resize changes is checked
    again (the degrees, the batch split, the layouts' rules): the spec was checked whole at submit."""
    p, t = spec.parallel, spec.train
    for dims in spec.dims.resized(workers):
        if spec.program is not None:  # the program reshards itself; only its mesh's dp changes
            if (dims.tp, dims.pp) != (p.tp, p.pp):
                continue
            micro = t.micro_batch_size
        elif t.global_batch_size % dims.dp:
            continue
        else:
            per_rank = t.global_batch_size // dims.dp
            micro = max(m for m in range(1, min(t.micro_batch_size, per_rank) + 1) if per_rank % m == 0)
        degrees: dict[str, int | None] = {"tp": dims.tp, "pp": dims.pp, "cp": dims.cp, "ep": dims.ep}
        if p.dp_shard is not None:  # HSDP: its shard size where it divides the new dp, else FSDP over all of it
            degrees["dp_shard"] = p.dp_shard if dims.dp_replicate > 1 else None
        if p.dp is not None or spec.program is None:
            degrees["dp"] = dims.dp
        planned = spec.model_copy(update={
            "resources": spec.resources.model_copy(update={"workers": workers}),
            "parallel": p.model_copy(update=degrees),
            "train": t.model_copy(update={"micro_batch_size": micro})})
        if not any(True for _ in resize_violations(planned)):
            return planned
    return None


def resize_violations(spec: JobSpec) -> Iterator[Violation]:
    yield from degree_violations(spec)
    if spec.program is None:
        yield from layout_errors(spec)


def best_layout(spec: JobSpec, capacity: int) -> JobSpec | None:
    """The largest feasible layout within the job's elastic range and the capacity."""
    low, high = spec.resources.elastic_range
    for workers in range(min(high, capacity), low - 1, -1):
        planned = relayout(spec, workers)
        if planned is not None:
            return planned
    return None


class SizingAction(StrEnum):
    KEEP = "keep"  # the current layout fits
    RESIZE = "resize"  # restart on `spec` instead
    WAIT = "wait"  # ask again shortly: freed resources take a moment to show up
    GIVE_UP = "give_up"  # fewer than min_workers for too long: fail the job


@dataclass(frozen=True)
class CapacityStatus:
    """After a failure: the free slots for the job's next group and how long it has waited for them."""

    spec: JobSpec  # as submitted (its elastic range)
    current: JobSpec  # the layout of the group that failed
    free_slots: int
    waited_s: float
    settle_s: float
    timeout_s: float


@dataclass(frozen=True)
class SizingDecision:
    action: SizingAction
    spec: JobSpec | None = None  # RESIZE: the layout to run on


def on_capacity(status: CapacityStatus) -> SizingDecision:
    """Keep the layout if the cluster still fits it, else (once freed resources settled) shrink."""
    if status.free_slots >= status.current.world_size:
        return SizingDecision(SizingAction.KEEP)
    if status.waited_s > status.settle_s:
        planned = best_layout(status.spec, status.free_slots)
        if planned is not None:
            return SizingDecision(SizingAction.RESIZE, planned)
    if status.waited_s > status.timeout_s:
        return SizingDecision(SizingAction.GIVE_UP)
    return SizingDecision(SizingAction.WAIT)


@dataclass(frozen=True)
class GrowthStatus:
    """While running: the slots the job could use (its own plus the free ones)."""

    spec: JobSpec
    current: JobSpec
    free_slots: int


def on_growth(status: GrowthStatus) -> JobSpec | None:
    """A larger layout than the current one, if the job may grow and the cluster has room."""
    if status.current.world_size >= status.spec.resources.elastic_range[1]:
        return None
    planned = best_layout(status.spec, status.free_slots + status.current.world_size)
    if planned is None or planned.world_size <= status.current.world_size:
        return None
    return planned
