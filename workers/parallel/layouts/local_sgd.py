"""Local SGD: parameters averaged every parallel.local_sgd.period steps."""

from __future__ import annotations

from collections.abc import Iterator

from workers.parallel.layouts.accounting import (
    LayoutCost,
    accumulated_grad_bytes,
    params_per_rank,
    ring,
)
from workers.parallel.layouts.layout import Layout
from workers.spec import JobSpec, Violation


def local_sgd_rules(spec: JobSpec) -> Iterator[Violation]:
    p = spec.parallel
    if p.local_sgd is not None and (p.zero or p.tp > 1 or p.pp > 1):
        yield Violation("parallel.local_sgd",
            f"parallel.local_sgd applies to plain data parallelism (zero 0, tp 1, pp 1) "
            f"(zero={p.zero}, tp={p.tp}, pp={p.pp})")
    every = spec.fault_tolerance.integrity_check_every
    if p.local_sgd is not None and every % p.local_sgd.period:
        yield Violation("fault_tolerance.integrity_check_every",
            f"fault_tolerance.integrity_check_every must be a multiple of parallel.local_sgd.period: the "
            f"replicas are identical only right after an average (every={every}, "
            f"period={p.local_sgd.period})")


def cost(spec: JobSpec, facts) -> LayoutCost:
    assert spec.parallel.local_sgd is not None, "the layout of parallel.local_sgd"
    per_rank = params_per_rank(spec, facts)  # one parameter all-reduce every `period` steps, on average
    peak = (4 + 8 + accumulated_grad_bytes(spec)) * per_rank  # no gradient buffers: nothing is all-reduced
    return LayoutCost(16 * per_rank, ring(spec.dp) * 4 * per_rank / spec.parallel.local_sgd.period, peak)


# averaging every period steps
LAYOUT = Layout("local_sgd", lambda spec: spec.parallel.local_sgd is not None, local_sgd_rules, cost)
