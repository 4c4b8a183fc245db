"""ZeRO-1/2: optimiser state (and gradients) sharded over dp."""

from __future__ import annotations

from collections.abc import Iterator

from workers.parallel.layouts.accounting import (
    LayoutCost,
    accumulated_grad_bytes,
    optimizer_state_bytes,
    params_per_rank,
    ring,
)
from workers.parallel.layouts.layout import Layout
from workers.spec import JobSpec, Violation


def zero_rules(spec: JobSpec) -> Iterator[Violation]:
    p = spec.parallel
    if p.zero in (1, 2) and p.tp > 1:
        yield Violation("parallel.zero",
            f"parallel.zero 1/2 shard over dp only: use zero 3 (FSDP x TP) with tp > 1 (zero={p.zero}, tp={p.tp})")
    if p.offload_optimizer and p.zero not in (1, 2):
        yield Violation("parallel.offload_optimizer",
            f"parallel.offload_optimizer needs parallel.zero 1 or 2 (zero={p.zero})")


def cost(spec: JobSpec, facts) -> LayoutCost:
    # ZeRO-1: weights and grads whole, moments sharded; ZeRO-2: grads sharded too. Reduce-scatter +
    # all-gather move what one all-reduce does; ZeRO-2 reduce-scatters every micro-batch: (A + 1) halves.
    k, per_rank = spec.dp, params_per_rank(spec, facts)
    per_param = 8 + 8 / k if spec.parallel.zero == 1 else 4 + 12 / k
    rounds = 1.0 if spec.parallel.zero == 1 else (spec.grad_accum_steps + 1) / 2
    # At peak: ZeRO-1 holds whole gradients from earlier micro-batches, ZeRO-2 only its reduced rows.
    grads = accumulated_grad_bytes(spec) / (1 if spec.parallel.zero == 1 else k)
    peak = (4 + optimizer_state_bytes(spec) / k + grads) * per_rank
    return LayoutCost(per_param * per_rank, rounds * ring(k) * 4 * per_rank, peak)


# zero 1/2 over dp
LAYOUT = Layout("zero", lambda spec: spec.parallel.zero in (1, 2), zero_rules, cost)
