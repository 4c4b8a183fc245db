"""Local SGD as the replicate step without per-step gradient sync: every rank steps on its own gradients and
the parameters are averaged every `period` steps.

No gradient all-reduce at all: traffic is one parameter all-reduce per period,
2(K-1)/K x parameter bytes / period per step on average. Between averages the
replicas drift apart (that is the point: fewer synchronisations); right after
an average they are identical, and the run ends with one.
"""

from __future__ import annotations

import contextlib
import math
from contextlib import AbstractContextManager

import torch
import torch.distributed as dist
from torch import nn

from workers.parallel.base import StrategyContext, local_clip_grad_norm
from workers.parallel.common import average_in_place
from workers.parallel.control_group import ControlGroups
from workers.parallel.loop_hooks import NO_HOOKS, LoopHooks
from workers.telemetry import CommMeter


class LocalSGDAdamW(torch.optim.AdamW):
    """AdamW that averages the parameters over the group after every `period`-th step."""

    def __init__(self, params, *, period: int, total_steps: int, comm: CommMeter, group=None, **kwargs):
        super().__init__(params, foreach=None, **kwargs)  # as base.adamw
        self.period, self.total_steps, self.comm, self.group = period, total_steps, comm, group
        self.in_sync = True  # whether the replicas are identical: right after an average (and before step 1)

    @torch.no_grad()
    def step(self, closure=None):
        out = super().step(closure)
        # AdamW's own step count survives checkpoints, so the averaging schedule does too.
        first = next((p for g in self.param_groups for p in g["params"] if p in self.state), None)
        done = int(self.state[first]["step"]) if first is not None else 0
        self.in_sync = done % self.period == 0 or done == self.total_steps
        if self.in_sync:
            self.average_parameters()
        return out

    @torch.no_grad()
    def average_parameters(self) -> None:
        world = dist.get_world_size(self.group)
        if world == 1:
            return
        average_in_place([p for g in self.param_groups for p in g["params"]], self.group, self.comm)


class PeriodicAverage:
    """No gradient reduction; the optimizer averages the parameters every `period` steps."""

    meters_itself = True  # average_in_place meters the averages
    hooks: LoopHooks = NO_HOOKS

    def __init__(self, period: int) -> None:
        self.period = period
        self.optimizer: LocalSGDAdamW | None = None
        self.control: ControlGroups | None = None

    def wrap(self, model: nn.Module, ctx: StrategyContext) -> nn.Module:
        self.control = ctx.control
        return model

    def build_optimizer(self, wrapped: nn.Module, ctx: StrategyContext) -> torch.optim.Optimizer:
        t = ctx.spec.train
        self.optimizer = LocalSGDAdamW(wrapped.parameters(), period=self.period, total_steps=t.steps, comm=ctx.comm,
                                       lr=t.lr, weight_decay=t.weight_decay)
        return self.optimizer

    def no_sync(self, wrapped: nn.Module) -> AbstractContextManager:
        return contextlib.nullcontext()

    def reduce(self, wrapped: nn.Module, ctx: StrategyContext) -> None:
        pass  # the point: no per-step gradient sync

    def clip_grad_norm(self, wrapped: nn.Module, max_norm: float) -> float | None:
        norm = local_clip_grad_norm(wrapped, max_norm)
        # Gradients are not synchronised here, so neither is "non-finite": the trainer skips the
        # update on a non-finite norm, and a rank that skipped would miss the parameter average
        # its peers enter (a deadlock). Every rank sees non-finite if any rank does.
        assert self.control is not None, "wrap runs before the first step"
        bad = torch.tensor([0.0 if norm is None or math.isfinite(norm) else 1.0])  # a host flag: the CPU group
        return float("nan") if self.control.all_reduce(bad, op=dist.ReduceOp.MAX).item() else norm

    def replicas_identical(self) -> bool:
        # Between averages the replicas differ by design. A skipped step shifts the averaging schedule
        # off the check's steps (AdamW counts updates); such a check waits for the next averaged step.
        return self.optimizer is None or self.optimizer.in_sync
