"""Elastic sizing: the layout a job runs on for the worker slots the cluster can give it.

The global batch is kept, so a job resharded to fewer workers trains the same problem
with more gradient accumulation per rank. Model-parallel degrees (tp, pp) are kept when
the new world size allows it, otherwise dropped (DCP reshards the checkpoint onto
whatever layout results). How many slots are free is the caller's question
(service/supervisor/cluster.py); these functions only decide.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from workers.spec import SPEC_ERRORS, JobSpec
from workers.spec_checks import checked_spec


def relayout(spec: JobSpec, workers: int) -> JobSpec | None:
    """`spec` laid out on `workers` ranks with the same global batch, or None if no layout fits."""
    p, t = spec.parallel, spec.train
    if spec.program is not None:  # the program reshards itself; only its mesh's dp changes
        if workers % p.tp:
            return None
        data = spec.model_dump(mode="json")
        data["resources"]["workers"] = workers
        if p.dp is not None:
            data["parallel"]["dp"] = workers // p.tp
        try:
            return checked_spec(data, allow_fault_injection=True)
        except SPEC_ERRORS:
            return None
    for tp, pp in dict.fromkeys([(p.tp, p.pp), (p.tp, 1), (1, p.pp), (1, 1)]):
        if workers % (tp * pp):
            continue
        dp = workers // (tp * pp)
        if t.global_batch_size % dp:
            continue
        per_rank = t.global_batch_size // dp
        micro = max(m for m in range(1, min(t.micro_batch_size, per_rank) + 1) if per_rank % m == 0)
        data = spec.model_dump(mode="json")
        data["resources"]["workers"] = workers
        data["parallel"].update(dp=dp, tp=tp, pp=pp)
        data["train"]["micro_batch_size"] = micro
        try:
            return checked_spec(data, allow_fault_injection=True)  # fault injection was admitted at submit
        except SPEC_ERRORS:
            continue
    return None


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
