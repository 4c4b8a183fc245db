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

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from workers.models.description import ModelDescription, describe
from workers.parallel.base import (
    ForwardBackward,
    LossFn,
    StrategyContext,
    accumulate,
    adamw,
)
from workers.parallel.common import (
    global_grad_norm_clip,
    precision,
    reduce_partial_grads,
)
from workers.parallel.expert_parallel import reduce_expert_grads, sharded_experts, take_step_bytes
from workers.parallel.metering import metered
from workers.parallel.parallelize import data_parallel_mesh, parallelize
from workers.parallel.replicas import ReplicaGroup, replicated_over
from workers.parallel.tensor_plan import apply_tensor_plan


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, sequence_parallel: bool = False,
                          desc: ModelDescription | None = None) -> nn.Module:
    """Shard the model over `tp_mesh` in place by its plan (the spec's, the model's own, the GPT's)."""
    return apply_tensor_plan(model, tp_mesh, desc or describe(model), sequence_parallel)


class TensorParallelStrategy:
    """`parallel.tp > 1` with `zero: 0`: TP inside, plain gradient all-reduce over dp outside."""

    name = "tp"

    def wrap(self, model: nn.Module, ctx: StrategyContext) -> nn.Module:
        return parallelize(model, ctx)

    def build_optimizer(self, wrapped: nn.Module, ctx: StrategyContext) -> torch.optim.Optimizer:
        return adamw(wrapped.parameters(), ctx.spec)

    def forward_backward(self, wrapped: nn.Module, micro: list, loss_fn: LossFn,
                         ctx: StrategyContext) -> ForwardBackward:
        with metered(ctx.comm):
            with precision(ctx):
                fb = accumulate(wrapped, micro, loss_fn, ctx, contextlib.nullcontext)
            reduce_partial_grads(wrapped)
            self._average_over_dp(wrapped, ctx)
        if ctx.spec.parallel.ep > 1:  # the all-to-all (counted by the dispatch) and the experts' all-reduce
            ctx.comm.logical_bytes += take_step_bytes(wrapped) + reduce_expert_grads(wrapped, ctx)
        return fb

    @torch.no_grad()
    def _average_over_dp(self, wrapped: nn.Module, ctx: StrategyContext) -> None:
        dp_mesh = data_parallel_mesh(ctx)
        if dp_mesh.size() == 1:
            return
        group = dp_mesh.get_group()
        works = []
        experts = {id(p) for p in sharded_experts(wrapped)}  # each ep rank's own: reduce_expert_grads's
        for p in wrapped.parameters():
            if p.grad is None or id(p) in experts:
                continue
            local = p.grad._local_tensor if isinstance(p.grad, DTensor) else p.grad
            local.div_(dp_mesh.size())
            works.append(dist.all_reduce(local, group=group, async_op=True))
        for w in works:
            w.wait()

    def clip_grad_norm(self, wrapped: nn.Module, max_norm: float) -> float | None:
        return global_grad_norm_clip(wrapped, max_norm)

    def replica_groups(self, wrapped: nn.Module, ctx: StrategyContext) -> list[ReplicaGroup]:
        experts = sharded_experts(wrapped)
        ids = {id(p) for p in experts}
        shared = [p for p in wrapped.parameters() if id(p) not in ids]
        groups = replicated_over(data_parallel_mesh(ctx), shared)  # each tp rank's shards, over dp (x cp)
        return groups + (replicated_over(ctx.mesh["dp_mod_ep"], experts) if experts else [])
