"""The pipeline re-split policy: re-split unbalanced stages by their measured busy time.

When `parallel.pipeline.rebalance_threshold` is set and the slowest stage's median busy
time exceeds the fastest's by more than the threshold, the blocks are re-split by measured
cost and the group restarts from the next checkpoint with that split pinned (once per job:
measured costs after a move are noisier than the imbalance it fixed). Checkpoints reshard
because stage parameters keep the full model's names.
"""

from __future__ import annotations

from dataclasses import dataclass

from workers.parallel.pipeline.stage_plan import resplit_by_measured
from workers.parallel.pipeline.unit_costs_apart import unit_costs_apart
from workers.spec import JobSpec
from workers.spec_checks import checked_spec


@dataclass(frozen=True)
class PipelineStatus:
    spec: JobSpec  # the layout running now
    stage_busy_s: tuple[float, ...]  # median busy time of each stage over the window
    threshold: float
    already_resplit: bool = False


@dataclass(frozen=True)
class ResplitDecision:
    split: tuple[int, ...]  # blocks per stage
    stage_busy_s: tuple[float, ...]


def on_stage_times(status: PipelineStatus) -> ResplitDecision | None:
    if status.already_resplit:
        return None
    busy, pipe = list(status.stage_busy_s), status.spec.parallel.pipeline
    if min(busy) <= 0 or max(busy) / min(busy) - 1.0 <= status.threshold:
        return None  # balanced: no costs asked for
    # The cost model builds the model with torch, which a supervisor does not import: a child does.
    costs = unit_costs_apart(status.spec)
    split = resplit_by_measured(costs, busy, status.threshold, pipe.split if pipe else None)
    return None if split is None else ResplitDecision(tuple(split), status.stage_busy_s)


def resplit_spec(spec: JobSpec, split: tuple[int, ...]) -> JobSpec:
    """`spec` with the pipeline split pinned to `split`."""
    data = spec.model_dump(mode="json")
    data["parallel"]["pipeline"] = {**(data["parallel"].get("pipeline") or {}), "split": list(split)}
    return checked_spec(data, allow_fault_injection=True)  # fault injection was admitted at submit
