"""`parallel.zero: 1 | 2`: a plain replicated model and a sharded AdamW (workers/parallel/zero_optimizer.py,
which says how each stage shards and when it communicates; stage 2's buckets: zero_buckets.py)."""

from __future__ import annotations

import torch
from torch import nn

from workers.parallel.base import (
    ForwardBackward,
    LayoutCost,
    LossFn,
    StrategyContext,
    accumulate,
    accumulated_grad_bytes,
    optimizer_state_bytes,
    params_per_rank,
    ring,
)
from workers.parallel.common import apply_activation_checkpointing, precision
from workers.parallel.replicas import ReplicaGroup, replicated_over
from workers.parallel.zero_optimizer import ShardedAdamW
from workers.spec import Violation


class ZeroStrategy:
    """`parallel.zero: 1 | 2`: a plain replicated model and a sharded AdamW."""

    name = "zero"

    @staticmethod
    def selects(spec) -> bool:
        return spec.parallel.zero in (1, 2)

    @staticmethod
    def spec_errors(spec):
        p = spec.parallel
        if p.zero in (1, 2) and p.tp > 1:
            yield Violation("parallel.zero",
                f"parallel.zero 1/2 shard over dp only: use zero 3 (FSDP x TP) with tp > 1 (zero={p.zero}, tp={p.tp})")
        if p.zero == 2 and spec.supervisor.straggler.policy == "rebalance":
            # Buckets are reduce-scattered in every micro-batch: uneven micro-batch counts mismatch collectives.
            yield Violation("supervisor.straggler.policy",
                f"supervisor.straggler.policy 'rebalance' is not available with parallel.zero 2: it reduce-scatters "
                f"gradients in every micro-batch, so uneven micro-batch counts per rank would desynchronise its "
                f"collectives; use 'report' or 'replace', or zero 0 or 1 (zero={p.zero})")
        if p.offload_optimizer and p.zero not in (1, 2):
            yield Violation("parallel.offload_optimizer",
                f"parallel.offload_optimizer needs parallel.zero 1 or 2 (zero={p.zero})")

    @staticmethod
    def cost(spec, facts) -> LayoutCost:
        # ZeRO-1: weights and grads whole, moments sharded; ZeRO-2: grads sharded too. Reduce-scatter +
        # all-gather move what one all-reduce does; ZeRO-2 reduce-scatters every micro-batch: (A + 1) halves.
        k, per_rank = spec.dp, params_per_rank(spec, facts)
        per_param = 8 + 8 / k if spec.parallel.zero == 1 else 4 + 12 / k
        rounds = 1.0 if spec.parallel.zero == 1 else (spec.grad_accum_steps + 1) / 2
        # At peak: ZeRO-1 holds whole gradients from earlier micro-batches, ZeRO-2 only its reduced rows.
        grads = accumulated_grad_bytes(spec) / (1 if spec.parallel.zero == 1 else k)
        peak = (4 + optimizer_state_bytes(spec) / k + grads) * per_rank
        return LayoutCost(per_param * per_rank, rounds * ring(k) * 4 * per_rank, peak)

    def __init__(self) -> None:
        self.optimizer: ShardedAdamW | None = None

    def wrap(self, model: nn.Module, ctx: StrategyContext) -> nn.Module:
        model = model.to(ctx.device)
        apply_activation_checkpointing(model, ctx)
        return model

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

    @staticmethod
    def replicas(spec) -> int:
        return spec.dp

    def replica_groups(self, wrapped: nn.Module, ctx: StrategyContext) -> list[ReplicaGroup]:
        return replicated_over(ctx.mesh["dp"], wrapped.parameters())  # the all-gather leaves them whole everywhere

    def _optimizer(self) -> ShardedAdamW:
        assert self.optimizer is not None, "build_optimizer runs before the first step"
        return self.optimizer
