"""Splitting a model with repeated blocks into pipeline stages: a balanced contiguous split.

The units of splitting are, in order, the embedding (every part the forward runs before the
blocks), every block, and the head (every part after them). A stage is a contiguous run of
units. Costs are estimated forward FLOPs per sequence (`workers.parallel.pipeline.costs`; backward is
about twice the forward for every unit, so the ratio is the same); the split minimises the most
expensive stage (the pipeline runs at the pace of its slowest stage). The stage modules are
`workers.parallel.pipeline.stage`.
"""

from __future__ import annotations

from workers.parallel.pipeline.costs import unit_costs
from workers.parallel.pipeline.stage_plan import (
    StagePlan,
    balanced_split,
    plans_from_costs,
    resplit_by_measured,
    stage_to_rank,
)
from workers.spec import JobSpec

__all__ = ["StagePlan", "balanced_split", "plan_stages", "rebalanced_split", "stage_to_rank", "unit_costs"]


def plan_stages(spec: JobSpec, n_stages: int, split: list[int] | None = None) -> list[StagePlan]:
    """The stage plans: `split` pins blocks per stage; otherwise balanced by estimated cost."""
    return plans_from_costs(unit_costs(spec), n_stages, split)


def rebalanced_split(spec: JobSpec, busy_s: list[float], threshold: float) -> list[int] | None:
    """Blocks per stage re-balanced by measured cost (stage_plan.resplit_by_measured), or None."""
    if min(busy_s) <= 0 or max(busy_s) / min(busy_s) - 1.0 <= threshold:
        return None  # within the threshold: no model build for the costs
    pipe = spec.parallel.pipeline
    return resplit_by_measured(unit_costs(spec), busy_s, threshold, pipe.split if pipe else None)
