"""Elastic re-planning: how many workers the cluster can give a job, and its layout on them.

The global batch is kept, so a job resharded to fewer workers trains the same
problem with more gradient accumulation per rank. Model-parallel degrees (tp, pp)
are kept when the new world size allows it, otherwise dropped (DCP reshards the
checkpoint onto whatever layout results).
"""

from __future__ import annotations

import math

import ray

from workers.spec import SPEC_ERRORS, JobSpec
from workers.spec_checks import checked_spec


def free_slots_per_node(bundle: dict[str, float]) -> dict[str, int]:
    """How many more workers of this shape fit on each live node right now (by node id)."""
    per_node = ray._private.state.available_resources_per_node()
    return {node: min(math.floor(available.get(key, 0.0) / need + 1e-9) for key, need in bundle.items() if need > 0)
            for node, available in per_node.items()}


def free_worker_slots(bundle: dict[str, float], exclude: frozenset[str] = frozenset()) -> int:
    """How many more workers of this shape fit on the live nodes right now, leaving out `exclude`."""
    return sum(n for node, n in free_slots_per_node(bundle).items() if node not in exclude)


def relayout(spec: JobSpec, workers: int) -> JobSpec | None:
    """`spec` laid out on `workers` ranks with the same global batch, or None if no layout fits."""
    p, t = spec.parallel, spec.train
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
