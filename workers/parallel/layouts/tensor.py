"""Tensor (and Megatron sequence) parallelism: a plan to shard by, heads that divide."""

from __future__ import annotations

from collections.abc import Iterator

from workers.parallel.layouts.accounting import (
    LayoutCost,
    accumulated_grad_bytes,
    params_per_rank,
    ring,
)
from workers.parallel.layouts.layout import Layout
from workers.spec import GPTModelSpec, JobSpec, ModelStructure, Violation, sequence_length, structure_of


def _plan_errors(spec: JobSpec, facts: ModelStructure):
    p, m = spec.parallel, spec.model
    if facts.tp_plan is False:
        yield Violation("model.tp_plan",
            f"model.tp_plan is needed for parallel.tp > 1: model {facts.name!r} ships no tensor-parallel plan; "
            f"give one as {{module FQN glob: colwise | rowwise | ...}}, e.g. "
            f"{{'layers.*.attn.q': colwise, 'layers.*.attn.out': rowwise}} (tp={p.tp})")
    elif facts.tp_plan is None and facts.name == "entrypoint":
        yield Violation("model.tp_plan",
            f"model.tp_plan is needed for parallel.tp > 1 with a model.entrypoint: Trainyard cannot know which "
            f"layers of a user module to shard; give {{module FQN glob: colwise | rowwise | ...}} (tp={p.tp})")
    if isinstance(m, GPTModelSpec):
        if m.n_heads % p.tp or m.d_model % p.tp:
            yield Violation("parallel.tp",
                f"parallel.tp must divide model.n_heads and model.d_model "
                f"(tp={p.tp}, n_heads={m.n_heads}, d_model={m.d_model})")
        return
    for what, n in (("attention heads", facts.heads), ("key/value heads", facts.kv_heads)):
        if n and n % p.tp:
            yield Violation("parallel.tp",
                f"parallel.tp must divide the model's {what} (model.hf.config: {n}, tp={p.tp}): "
                f"each rank holds whole heads")


def tensor_parallel_errors(spec: JobSpec) -> Iterator[Violation]:
    p = spec.parallel
    if p.tp > 1:
        yield from _plan_errors(spec, structure_of(spec))
    if p.sequence_parallel and p.tp == 1:
        yield Violation("parallel.sequence_parallel", f"parallel.sequence_parallel needs parallel.tp > 1 (tp={p.tp})")
    seq = sequence_length(spec)
    if p.sequence_parallel and p.tp > 1 and seq and seq % p.tp:
        yield Violation("parallel.sequence_parallel",
            f"parallel.sequence_parallel needs parallel.tp to divide the sequence length (tp={p.tp}, seq_len={seq})")


def cost(spec: JobSpec, facts) -> LayoutCost:
    per_rank = params_per_rank(spec, facts)
    peak = (4 + 8 + accumulated_grad_bytes(spec)) * per_rank  # the dp all-reduce runs in place on `.grad`
    return LayoutCost(16 * per_rank, ring(spec.dims.size("dp_cp")) * 4 * per_rank, peak)


# tp > 1 with zero 0 (DP x TP)
LAYOUT = Layout("tp", lambda spec: spec.parallel.tp > 1, tensor_parallel_errors, cost)
