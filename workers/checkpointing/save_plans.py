"""Save plans cached while a job's layout stays the same (DCP's plan caching).

Every DCP save plans: each rank builds its local plan, the plans are gathered on rank 0, which
deduplicates and validates them into the global plan and the metadata, and scatters the result. With
`enable_plan_caching`, a rank whose local plan equals its last one sends an empty plan instead, and
rank 0, given only empty plans, reuses its cached global plan and metadata: the gather and scatter
still run (they are how ranks agree), but they carry nothing and rank 0 plans nothing.

The cache lives in class attributes of DCP's SavePlanner, keyed per planner. Each Checkpointer has its
own key: a restart or a reshard builds a new Trainer and Checkpointer, so a new layout never meets an
old plan; the previous keys are dropped then (a warm process keeps no plans of a job it left).
Within one Checkpointer a changed local plan (the progress gaining a key) is sent again, as DCP does.
"""

from __future__ import annotations

import uuid

from torch.distributed.checkpoint import DefaultSavePlanner
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner

_PREFIX = "trainyard-checkpointer-"
_CACHES = ("_cached_save_plan", "_cached_all_plans", "_cached_global_plan", "_cached_metadata",
           "_cached_final_save_plan")


class PlanCounts:
    """What planning ran for this Checkpointer's saves (for its test and docs/scale.md's figure)."""

    def __init__(self) -> None:
        self.local_plans_sent = 0  # saves whose local plan this rank sent whole (not the cached one)
        self.global_plans = 0  # on rank 0: saves whose global plan was built (not reused)


class _CountingPlanner(DefaultSavePlanner):
    counts: PlanCounts

    def create_local_plan(self) -> SavePlan:
        plan = super().create_local_plan()
        self.counts.local_plans_sent += 1 if plan.usable else 0
        return plan

    def _create_global_plan(self, all_plans):  # runs only when the cache cannot answer
        self.counts.global_plans += 1
        return super()._create_global_plan(all_plans)


class SavePlans:
    """One Checkpointer's plan cache: `planner()` for each of its saves."""

    def __init__(self) -> None:
        forget_plans()
        self.key = f"{_PREFIX}{uuid.uuid4().hex}"
        self.counts = PlanCounts()

    def planner(self) -> DefaultSavePlanner:
        planner = _CountingPlanner(enable_plan_caching=True)
        planner._cached_plans_key = self.key  # per Checkpointer, not DCP's default (the class name)
        planner.counts = self.counts
        return planner


def forget_plans() -> None:
    """Drop every Checkpointer's cached plans in this process."""
    for name in _CACHES:
        cache = getattr(SavePlanner, name, None)
        if isinstance(cache, dict):
            for key in [k for k in cache if str(k).startswith(_PREFIX)]:
                del cache[key]
