"""Plain data parallelism (DDP), with parallel.compression and parallel.collectives as its communication hook."""

from __future__ import annotations

from collections.abc import Iterator

from workers.parallel.layouts.accounting import (
    SIGN_KINDS,
    LayoutCost,
    accumulated_grad_bytes,
    compressed_fraction,
    expert_shard_params,
    params_per_rank,
    ring,
)
from workers.parallel.layouts.layout import Layout
from workers.spec import JobSpec, Violation


def compression_rules(spec: JobSpec) -> Iterator[Violation]:
    p, gpu = spec.parallel, spec.resources.gpus_per_worker > 0
    if p.compression is None:
        return
    if p.zero or p.tp > 1 or p.pp > 1:
        yield Violation("parallel.compression",
            f"parallel.compression applies to plain data parallelism (zero 0, tp 1, pp 1) "
            f"(zero={p.zero}, tp={p.tp}, pp={p.pp})")
    if p.local_sgd is not None:
        yield Violation("parallel.compression",
            "parallel.compression and parallel.local_sgd exclude each other "
            "(local SGD does not all-reduce gradients)")
    if p.compression.kind == "bf16" and not gpu:
        yield Violation("parallel.compression.kind",
            "parallel.compression.kind 'bf16' needs GPU workers: the bf16 hook all-reduces bfloat16, which "
            "gloo (CPU) does not support, so use 'fp16' or 'powersgd' on CPU "
            f"(gpus_per_worker={spec.resources.gpus_per_worker})")
    if p.compression.error_feedback is not None and p.compression.kind not in SIGN_KINDS:
        yield Violation("parallel.compression.error_feedback",
            "parallel.compression.error_feedback applies to kind 'onebit' or 'signsgd' "
            f"(kind={p.compression.kind!r}: powersgd always keeps its error feedback, fp16/bf16 have none)")


def collectives_rules(spec: JobSpec) -> Iterator[Violation]:
    """parallel.collectives 'hierarchical' is DDP's hook: the axes it refuses are the compatibility table's
    (layouts/compatibility.py); here what the table has no feature for."""
    p = spec.parallel
    if p.collectives != "hierarchical":
        return
    if p.compression is not None and p.compression.kind not in ("fp16", "bf16"):
        yield Violation("parallel.collectives",
            f"parallel.collectives 'hierarchical' compresses only its cross-node all-reduce, with a codec of one "
            f"summed tensor (fp16, bf16); parallel.compression.kind {p.compression.kind!r} is not one (powersgd "
            f"orthogonalises between two all-reduces of the whole group, onebit and signsgd all-gather every "
            f"rank's signs): use 'flat' with it, or kind 'fp16'")
    if p.parameter_server is not None:
        yield Violation("parallel.collectives",
            "parallel.collectives 'hierarchical' is not available with parallel.parameter_server (its trainers' "
            "dense all-reduce stays flat)")


def ddp_rules(spec: JobSpec) -> Iterator[Violation]:
    yield from compression_rules(spec)
    yield from collectives_rules(spec)


def cost(spec: JobSpec, facts) -> LayoutCost:
    per_rank, k = params_per_rank(spec, facts), spec.dims.size("dp_cp")
    # DDP's reducer keeps a flat copy of every gradient (its buckets) besides `.grad`, across steps.
    peak = (4 + 8 + 4 + accumulated_grad_bytes(spec)) * per_rank
    # Expert shards (ep) skip DDP: reduced over the dp / ep ranks holding the same shard.
    shards = expert_shard_params(spec, facts)
    comm = ring(k) * 4 * (per_rank - shards) * compressed_fraction(spec) + ring(k // spec.parallel.ep) * 4 * shards
    return LayoutCost(16 * per_rank, comm, peak)


# the last resort
LAYOUT = Layout("ddp", lambda spec: True, ddp_rules, cost)
