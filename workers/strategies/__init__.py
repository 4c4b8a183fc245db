"""Strategy registry: the one place a parallel layout maps to its implementation."""

from __future__ import annotations

from workers.spec import JobSpec
from workers.strategies.base import Strategy, StrategyContext
from workers.strategies.ddp import DDPStrategy
from workers.strategies.pipeline import PipelineStrategy

STRATEGIES: dict[str, type] = {
    "ddp": DDPStrategy,
    "pipeline": PipelineStrategy,
}


def strategy_name(spec: JobSpec) -> str:
    """The registry key for a spec's parallel layout (later layouts extend this)."""
    if spec.parallel.pp > 1:
        return "pipeline"
    return "ddp"


def build_strategy(spec: JobSpec) -> Strategy:
    return STRATEGIES[strategy_name(spec)]()


__all__ = ["STRATEGIES", "Strategy", "StrategyContext", "build_strategy", "strategy_name"]
