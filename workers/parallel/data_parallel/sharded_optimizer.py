"""ZeRO-1/2 as the replicate step's reducer: whole parameters on every data-parallel rank, AdamW's state (and,
at stage 2, the gradients) sharded over them by ShardedAdamW (workers/parallel/zero_optimizer.py, which says
how each stage shards and when it communicates; stage 2's buckets: zero_buckets.py). The optimizer is the
reducer: it reduce-scatters the gradients, clips by the global norm and all-gathers the updated rows."""

from __future__ import annotations

from contextlib import AbstractContextManager

import torch
from torch import nn

from workers.parallel.base import StrategyContext
from workers.parallel.loop_hooks import NO_HOOKS, LoopHooks
from workers.parallel.parallelize import data_parallel_mesh
from workers.parallel.zero_optimizer import ShardedAdamW


class ShardedOptimizerReduce:
    meters_itself = True  # ShardedAdamW meters its collectives
    hooks: LoopHooks = NO_HOOKS

    def __init__(self, stage: int, offload: bool) -> None:
        self.stage, self.offload = stage, offload
        self.optimizer: ShardedAdamW | None = None

    def wrap(self, model: nn.Module, ctx: StrategyContext) -> nn.Module:
        return model

    def build_optimizer(self, wrapped: nn.Module, ctx: StrategyContext) -> torch.optim.Optimizer:
        t = ctx.spec.train
        self.optimizer = ShardedAdamW(wrapped.parameters(), lr=t.lr, weight_decay=t.weight_decay, stage=self.stage,
                                      mesh=data_parallel_mesh(ctx), comm=ctx.comm, offload=self.offload)
        return self.optimizer

    def no_sync(self, wrapped: nn.Module) -> AbstractContextManager:
        return self._optimizer().micro_batch()  # stage 2: each micro-batch's buckets reduce-scattered in backward

    def reduce(self, wrapped: nn.Module, ctx: StrategyContext) -> None:
        self._optimizer().reduce_scatter_grads()

    def clip_grad_norm(self, wrapped: nn.Module, max_norm: float) -> float | None:
        return self._optimizer().clip_grad_norm(max_norm)

    def replicas_identical(self) -> bool:
        return True  # the all-gather leaves every parameter whole everywhere

    def _optimizer(self) -> ShardedAdamW:
        assert self.optimizer is not None, "build_optimizer runs before the first step"
        return self.optimizer
