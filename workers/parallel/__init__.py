"""Parallel strategies: one file per strategy behind one interface (base.py), chosen by registry.py.

Its names load on first use (workers/lazy.py): the supervisor and the API import torch-free
modules of this package (layouts/, pipeline/bubble.py, pipeline/summary.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from workers.lazy import lazy_names

if TYPE_CHECKING:
    from workers.parallel.base import Strategy, StrategyContext
    from workers.parallel.layouts import strategy_name
    from workers.parallel.registry import REGISTRY, STRATEGIES, build_strategy

# Each name in three places (the typed imports, __all__ for linters, this table): tests/workers/test_lazy_packages.py
_HOME = {**dict.fromkeys(("Strategy", "StrategyContext"), "base"),
         **dict.fromkeys(("REGISTRY", "STRATEGIES", "build_strategy"), "registry"), "strategy_name": "layouts"}
__all__ = ["REGISTRY", "STRATEGIES", "Strategy", "StrategyContext", "build_strategy", "strategy_name"]
__getattr__ = lazy_names(__name__, _HOME)
