"""Strategy registry: the one place a parallel layout maps to its implementation."""

from __future__ import annotations

from workers.spec import JobSpec
from workers.strategies.base import Strategy, StrategyContext
from workers.strategies.ddp import DDPStrategy

STRATEGIES: dict[str, type] = {
    "ddp": DDPStrategy,
}


def strategy_name(spec: JobSpec) -> str:
    """The registry key for a spec's parallel layout (later layouts extend this)."""
    return "ddp"


def build_strategy(spec: JobSpec) -> Strategy:
    return STRATEGIES[strategy_name(spec)]()


__all__ = ["STRATEGIES", "Strategy", "StrategyContext", "build_strategy", "strategy_name"]
