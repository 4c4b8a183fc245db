"""Megatron-style tensor parallelism with DTensor from the model's plan (workers/parallel/tensor_plan.py), and DP x TP.

Within a block, q/k/v and mlp.fc are column-parallel (each tp rank holds
n_heads / tp whole heads and 4d / tp hidden units) and attn.proj and mlp.proj
are row-parallel, so a block costs one all-reduce forward and one backward per
sub-layer. With `sequence_parallel` the residual stream between sub-layers is
split along the sequence: LayerNorms run on 1/tp of the tokens and the
all-reduces become all-gather + reduce-scatter pairs. Embeddings, the final
LayerNorm and the head stay replicated over tp.

Data parallelism on top (`dp > 1`, `zero: 0`) all-reduces each gradient's local
piece over the dp group once per step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from workers.models.description import ModelDescription, describe
from workers.parallel.base import (
    ForwardBackward,
    LayoutCost,
    LossFn,
    StrategyContext,
    accumulate,
    accumulated_grad_bytes,
    adamw,
    one_pass,
    params_per_rank,
    ring,
)
from workers.parallel.common import (
    apply_activation_checkpointing,
    global_grad_norm_clip,
    model_description,
    precision,
    reduce_partial_grads,
)
from workers.parallel.metering import metered
from workers.parallel.replicas import ReplicaGroup, replicated_over
from workers.parallel.tensor_plan import apply_tensor_plan
from workers.spec import (
    GPTModelSpec,
    JobSpec,
    ModelStructure,
    Violation,
    sequence_length,
    structure_of,
)


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, sequence_parallel: bool = False,
                          desc: ModelDescription | None = None) -> nn.Module:
    """Shard the model over `tp_mesh` in place by its plan (the spec's, the model's own, the GPT's)."""
    return apply_tensor_plan(model, tp_mesh, desc or describe(model), sequence_parallel)


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


def tensor_parallel_comm_bytes(spec: JobSpec, f) -> float:
    """Activations of one micro-batch, A = mb x seq x d x 4 bytes, through the TP collectives per step."""
    p, tp, accum = spec.parallel, spec.parallel.tp, spec.grad_accum_steps
    if tp == 1 or not f.layers:
        return 0.0
    a = spec.train.micro_batch_size * f.seq_len * f.d_model * 4
    if p.sequence_parallel:
        # per block: forward 2 all-gathers + 2 reduce-scatters, backward 2 all-gathers + 4 input-grad
        # all-reduces (q, k, v, fc); plus the sequence split/merge at the ends and the LayerNorm grads.
        per_micro = f.layers * 14 * one_pass(tp) * a + 2 * one_pass(tp) * a
        return accum * per_micro + ring(tp) * 4 * f.layernorm_params
    # per block: forward 2 all-reduces (row-parallel outputs), backward 4 (q, k, v, fc input grads)
    return accum * f.layers * 6 * ring(tp) * a


class TensorParallelStrategy:
    """`parallel.tp > 1` with `zero: 0`: TP inside, plain gradient all-reduce over dp outside."""

    name = "tp"

    @staticmethod
    def selects(spec) -> bool:
        return spec.parallel.tp > 1

    @staticmethod
    def spec_errors(spec: JobSpec) -> Iterator[Violation]:
        return tensor_parallel_errors(spec)

    @staticmethod
    def cost(spec, facts) -> LayoutCost:
        per_rank = params_per_rank(spec, facts)
        peak = (4 + 8 + accumulated_grad_bytes(spec)) * per_rank  # the dp all-reduce runs in place on `.grad`
        return LayoutCost(16 * per_rank, ring(spec.dp) * 4 * per_rank, peak)

    def wrap(self, model: nn.Module, ctx: StrategyContext) -> nn.Module:
        model = model.to(ctx.device)
        apply_tensor_parallel(model, ctx.mesh["tp"], ctx.spec.parallel.sequence_parallel, model_description(model, ctx))
        apply_activation_checkpointing(model, ctx)
        return model

    def build_optimizer(self, wrapped: nn.Module, ctx: StrategyContext) -> torch.optim.Optimizer:
        return adamw(wrapped.parameters(), ctx.spec)

    def forward_backward(self, wrapped: nn.Module, micro: list, loss_fn: LossFn,
                         ctx: StrategyContext) -> ForwardBackward:
        with metered(ctx.comm):
            with precision(ctx):
                fb = accumulate(wrapped, micro, loss_fn, ctx, contextlib.nullcontext)
            reduce_partial_grads(wrapped)
            self._average_over_dp(wrapped, ctx)
        return fb

    @torch.no_grad()
    def _average_over_dp(self, wrapped: nn.Module, ctx: StrategyContext) -> None:
        dp_mesh = ctx.mesh["dp"]
        if dp_mesh.size() == 1:
            return
        group = dp_mesh.get_group()
        works = []
        for p in wrapped.parameters():
            if p.grad is None:
                continue
            local = p.grad._local_tensor if isinstance(p.grad, DTensor) else p.grad
            local.div_(dp_mesh.size())
            works.append(dist.all_reduce(local, group=group, async_op=True))
        for w in works:
            w.wait()

    def clip_grad_norm(self, wrapped: nn.Module, max_norm: float) -> float | None:
        return global_grad_norm_clip(wrapped, max_norm)

    @staticmethod
    def replicas(spec) -> int:
        return spec.dp

    def replica_groups(self, wrapped: nn.Module, ctx: StrategyContext) -> list[ReplicaGroup]:
        return replicated_over(ctx.mesh["dp"], wrapped.parameters())  # each tp rank's shards, over dp
