"""The replicate step: every rank of the data-parallel (x cp) group holds the same parameters (whole, or the
same tensor-parallel shards) and averages its gradients over the group once per step. Plain data
parallelism (layout "ddp", with parallel.compression as DDP's hook), dp x tp (layout "tp"), ZeRO-1/2 (layout
"zero": the sharded optimizer reduces) and local SGD (layout "local_sgd": no per-step gradient sync) are this
one step with its options; its reducer follows the options' kind and the parameters' type (reducers.py).
Expert shards (parallel.ep) are reduced beside it, over the ranks that hold the same shard. A pipeline
(workers/parallel/pipeline/) applies it to each rank's stages and calls its `reduce` after the schedule's
backward: the schedule drives forward and backward, the step reduces."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from workers.parallel.base import ForwardBackward, LossFn, StrategyContext, accumulate
from workers.parallel.common import precision
from workers.parallel.data_parallel.reducers import GradientReducer, reducer_for
from workers.parallel.expert_parallel import reduce_expert_grads, sharded_experts, take_step_bytes
from workers.parallel.layouts.data_parallel_options import DataParallelOptions
from workers.parallel.loop_hooks import NO_HOOKS, LoopHooks
from workers.parallel.metering import metered
from workers.parallel.parallelize import data_parallel_mesh, parallelize
from workers.parallel.replicas import ReplicaGroup, replicated_over


class ReplicateStep:
    name = "replicate"

    @property
    def hooks(self) -> LoopHooks:
        """Its reducer's (onebit/signsgd: the residuals with the checkpoints); the export gathers DTensor
        shards as by default."""
        return self.reducer.hooks if self.reducer is not None else NO_HOOKS

    def __init__(self, options: DataParallelOptions | None = None, group=None) -> None:
        self.options = options  # from the spec at wrap when the registry builds it bare
        self.group = group  # where not the options' dp x cp: chimera's stage copies and their replicas
        self.reducer: GradientReducer | None = None

    def wrap(self, model: nn.Module, ctx: StrategyContext) -> nn.Module:
        """`parallelize`, then this step: the registry's strategy for layouts "ddp", "tp", "zero", "local_sgd"."""
        return self.apply(parallelize(model, ctx), ctx)

    def apply(self, model: nn.Module, ctx: StrategyContext) -> nn.Module:
        self.options = self.options or DataParallelOptions.of(ctx.spec)
        self.reducer = reducer_for(model, self.options, self.group)
        return self.reducer.wrap(model, ctx)

    def build_optimizer(self, wrapped: nn.Module, ctx: StrategyContext) -> torch.optim.Optimizer:
        return self._reducer().build_optimizer(wrapped, ctx)

    def forward_backward(self, wrapped: nn.Module, micro: list, loss_fn: LossFn,
                         ctx: StrategyContext) -> ForwardBackward:
        reducer = self._reducer()
        # The local all-reduce's collectives are metered here; DDP's hook, ZeRO's optimizer and local SGD's
        # averages meter their own.
        with contextlib.nullcontext() if reducer.meters_itself else metered(ctx.comm):
            with precision(ctx):
                fb = accumulate(wrapped, micro, loss_fn, ctx, lambda: reducer.no_sync(wrapped))
            reducer.reduce(wrapped, ctx)
        if ctx.spec.parallel.ep > 1:  # the step's all-to-all (forward and backward) and the experts' all-reduce
            ctx.comm.logical_bytes += take_step_bytes(wrapped) + reduce_expert_grads(wrapped, ctx)
        return fb

    def reduce(self, wrapped: nn.Module, ctx: StrategyContext) -> None:
        """The reduction alone, for a driver that ran forward and backward itself (a pipeline's schedule)."""
        self._reducer().reduce(wrapped, ctx)

    def clip_grad_norm(self, wrapped: nn.Module, max_norm: float) -> float | None:
        return self._reducer().clip_grad_norm(wrapped, max_norm)

    def replica_groups(self, wrapped: nn.Module, ctx: StrategyContext) -> list[ReplicaGroup]:
        if not self._reducer().replicas_identical():
            return []
        experts = sharded_experts(wrapped)
        ids = {id(p) for p in experts}
        shared = [p for p in wrapped.parameters() if id(p) not in ids]
        groups = replicated_over(data_parallel_mesh(ctx), shared)  # whole (or the same tp shards) over dp (x cp)
        if experts:  # each expert shard: on the ranks at the same place of every expert group
            groups += replicated_over(ctx.mesh["dp_mod_ep"], experts)
        return groups

    def _reducer(self) -> GradientReducer:
        assert self.reducer is not None, "wrap runs before the first step"
        return self.reducer
