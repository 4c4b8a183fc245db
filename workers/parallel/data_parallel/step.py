"""The data-parallel step's interface and where it is built: `parallelize` applies tp/sp, cp, ep and
activation checkpointing (workers/parallel/parallelize.py), then the step the spec's DataParallelOptions
name wraps what that returns and trains it (a Strategy's methods, workers/parallel/base.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from torch import nn

from workers.parallel.base import Strategy, StrategyContext
from workers.parallel.data_parallel.replicate import ReplicateStep
from workers.parallel.layouts.data_parallel_options import DataParallelKind, DataParallelOptions


class DataParallelStep(Strategy, Protocol):
    def apply(self, model: nn.Module, ctx: StrategyContext) -> nn.Module:
        """The step applied to a model `parallelize` has already parallelized."""


# The step of each kind built so far; the other kinds still run as whole strategies (registry.py).
STEPS: dict[DataParallelKind, Callable[[DataParallelOptions], DataParallelStep]] = dict.fromkeys(
    ("replicate", "zero1", "zero2", "local_sgd"), ReplicateStep)


def apply_data_parallel(model: nn.Module, ctx: StrategyContext,
                        options: DataParallelOptions) -> tuple[nn.Module, DataParallelStep]:
    """(the module this rank trains, the step that trains it) for a parallelized `model`."""
    step = STEPS[options.kind](options)
    return step.apply(model, ctx), step
