"""FSDP2 (zero 3), also FSDP x TP and HSDP (parallel.dp_shard)."""

from __future__ import annotations

from collections.abc import Iterator

from workers.parallel.data_parallel.shard_root import gathered_per_micro_batch
from workers.parallel.layouts.accounting import (
    LayoutCost,
    accumulated_grad_bytes,
    kept_expert_params,
    one_pass,
    params_per_rank,
    ring,
)
from workers.parallel.layouts.layout import Layout
from workers.spec import JobSpec, Violation


def fsdp_rules(spec: JobSpec) -> Iterator[Violation]:
    p, dp = spec.parallel, spec.dp
    if p.dp_shard is not None:
        if p.zero != 3:
            yield Violation("parallel.dp_shard",
                f"parallel.dp_shard (HSDP) needs parallel.zero 3 (zero={p.zero}, dp_shard={p.dp_shard})")
        elif dp % p.dp_shard:
            yield Violation("parallel.dp_shard",
                f"parallel.dp_shard must divide parallel.dp (dp={dp}, dp_shard={p.dp_shard})")
    if p.fsdp_accumulate != "sharded" and p.zero != 3:
        yield Violation("parallel.fsdp_accumulate",
            f"parallel.fsdp_accumulate applies to zero 3 only (zero={p.zero}, "
            f"fsdp_accumulate={p.fsdp_accumulate!r})")
    if not p.reshard_after_forward and p.zero != 3:
        yield Violation("parallel.reshard_after_forward",
            f"parallel.reshard_after_forward applies to zero 3 only (zero={p.zero})")


def cost(spec: JobSpec, facts) -> LayoutCost:
    p, accum = spec.parallel, spec.grad_accum_steps
    dp = spec.dims.size("dp_cp")  # context-parallel ranks hold the same parameters: FSDP shards over them too
    kept = kept_expert_params(spec, facts)  # expert shards: whole on their rank, all-reduced across expert groups
    shard, per_rank = (p.dp_shard or spec.dp) * p.cp, params_per_rank(spec, facts) - kept
    grad_bytes = 4 * per_rank
    root = min(facts.outer_params, per_rank)
    gathered = accum * gathered_per_micro_batch(per_rank, root, p.reshard_after_forward)
    param_bytes = 2 if p.mixed_precision != "fp32" else 4  # params gathered in 16 bits
    syncs = accum if p.fsdp_accumulate == "sharded" else 1  # gradient reduce-scatters (+ replica all-reduces)
    comm = (gathered * param_bytes + syncs * grad_bytes) * one_pass(shard) \
        + syncs * ring(dp // shard) * grad_bytes / shard + ring(dp // p.ep) * 4 * kept
    # At peak: the shards, gradients kept from earlier micro-batches (1/K of them when sharded), and the
    # gathered weights: the root unit's (FSDP2 keeps it gathered from forward into backward) or all of them.
    grads = accumulated_grad_bytes(spec) / (shard if p.fsdp_accumulate == "sharded" else 1)
    held = per_rank if not p.reshard_after_forward else root
    peak = (4 + 8) / shard * per_rank + grads * per_rank + param_bytes * held + (4 + 8 + 4) * kept
    block = (per_rank - root) / max(facts.layers, 1)
    return LayoutCost(16 / shard * per_rank + 16 * kept, comm, peak, block * (param_bytes + 4 + 4))


# zero 3, FSDP x TP, HSDP
LAYOUT = Layout("fsdp", lambda spec: spec.parallel.zero == 3, fsdp_rules, cost)
