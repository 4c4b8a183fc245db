"""`parallel.zero: 1 | 2`: a plain replicated model and a sharded AdamW (workers/parallel/zero_optimizer.py,
which says how each stage shards and when it communicates; stage 2's buckets: zero_buckets.py)."""

from __future__ import annotations

import torch
from torch import nn

from workers.parallel.base import (
    ForwardBackward,
    LossFn,
    StrategyContext,
    accumulate,
)
from workers.parallel.common import precision
from workers.parallel.parallelize import parallelize
from workers.parallel.replicas import ReplicaGroup, replicated_over
from workers.parallel.zero_optimizer import ShardedAdamW


class ZeroStrategy:
    """`parallel.zero: 1 | 2`: a plain replicated model and a sharded AdamW."""

    name = "zero"

    def __init__(self) -> None:
        self.optimizer: ShardedAdamW | None = None

    def wrap(self, model: nn.Module, ctx: StrategyContext) -> nn.Module:
        return parallelize(model, ctx)

    def build_optimizer(self, wrapped: nn.Module, ctx: StrategyContext) -> torch.optim.Optimizer:
        p = ctx.spec.parallel
        self.optimizer = ShardedAdamW(
            wrapped.parameters(), lr=ctx.spec.train.lr, weight_decay=ctx.spec.train.weight_decay,
            stage=p.zero, mesh=ctx.mesh["dp"], comm=ctx.comm, offload=p.offload_optimizer,
        )
        return self.optimizer

    def forward_backward(self, wrapped: nn.Module, micro: list, loss_fn: LossFn,
                         ctx: StrategyContext) -> ForwardBackward:
        optimizer = self._optimizer()
        with precision(ctx):
            fb = accumulate(wrapped, micro, loss_fn, ctx, optimizer.micro_batch)
        optimizer.reduce_scatter_grads()
        return fb

    def clip_grad_norm(self, wrapped: nn.Module, max_norm: float) -> float | None:
        return self._optimizer().clip_grad_norm(max_norm)

    def replica_groups(self, wrapped: nn.Module, ctx: StrategyContext) -> list[ReplicaGroup]:
        return replicated_over(ctx.mesh["dp"], wrapped.parameters())  # the all-gather leaves them whole everywhere

    def _optimizer(self) -> ShardedAdamW:
        assert self.optimizer is not None, "build_optimizer runs before the first step"
        return self.optimizer
