"""Strategy registry: the one place a parallel layout maps to its implementation."""

from __future__ import annotations

from workers.spec import JobSpec
from workers.strategies.base import Strategy, StrategyContext
from workers.strategies.ddp import DDPStrategy
from workers.strategies.fsdp import FSDPStrategy
from workers.strategies.local_sgd import LocalSGDStrategy
from workers.strategies.pipeline import PipelineStrategy
from workers.strategies.sdp import SDPStrategy
from workers.strategies.tensor_parallel import TensorParallelStrategy
from workers.strategies.zero import ZeroStrategy

STRATEGIES: dict[str, type] = {
    "ddp": DDPStrategy,
    "pipeline": PipelineStrategy,
    "zero": ZeroStrategy,  # zero 1/2 over dp
    "fsdp": FSDPStrategy,  # zero 3, also FSDP x TP and HSDP
    "tp": TensorParallelStrategy,  # tp > 1 with zero 0 (DP x TP)
    "local_sgd": LocalSGDStrategy,  # parameter averaging every parallel.local_sgd.period steps
    "sdp": SDPStrategy,  # subnetwork data parallelism (parallel.sdp), also with zero 3 per subnetwork
}


def strategy_name(spec: JobSpec) -> str:
    """The registry key for a spec's parallel layout (later layouts extend this)."""
    p = spec.parallel
    if p.pp > 1:
        return "pipeline"
    if p.sdp is not None:
        return "sdp"
    if p.zero == 3:
        return "fsdp"
    if p.zero in (1, 2):
        return "zero"
    if p.tp > 1:
        return "tp"
    if p.local_sgd is not None:
        return "local_sgd"
    return "ddp"  # with parallel.compression as its communication hook


def build_strategy(spec: JobSpec) -> Strategy:
    return STRATEGIES[strategy_name(spec)]()


__all__ = ["STRATEGIES", "Strategy", "StrategyContext", "build_strategy", "strategy_name"]
