"""Parallel strategies: one file per strategy behind one interface (base.py), chosen by registry.py."""

from __future__ import annotations

from workers.parallel.base import Strategy, StrategyContext
from workers.parallel.registry import (
    REGISTRY,
    STRATEGIES,
    build_strategy,
    strategy_name,
)

__all__ = ["REGISTRY", "STRATEGIES", "Strategy", "StrategyContext", "build_strategy", "strategy_name"]
