"""The strategy registry: from the layout that runs a spec (workers/parallel/layouts/, torch-free: which
layout, its rules, its cost) to the strategy that trains it, by name. Adding a strategy is one file and
one line here, beside its layout's file and line in LAYOUTS (tests/workers/test_strategy_registry.py).
Layouts "ddp", "tp", "zero" and "local_sgd" are one strategy, the replicate data-parallel step with its options
(workers/parallel/data_parallel/): the layout name stays, for reporting."""

from __future__ import annotations

from workers.parallel.base import Strategy
from workers.parallel.data_parallel.replicate import ReplicateStep
from workers.parallel.fsdp import FSDPStrategy
from workers.parallel.layouts import layout_of
from workers.parallel.parameter_server.strategy import ParameterServerStrategy
from workers.parallel.pipeline.async_1f1b import AsyncPipelineStrategy
from workers.parallel.pipeline.chimera import ChimeraStrategy
from workers.parallel.pipeline.strategy import PipelineStrategy
from workers.parallel.sdp.strategy import SDPStrategy
from workers.spec import JobSpec

REGISTRY: tuple[type[Strategy], ...] = (ParameterServerStrategy, PipelineStrategy, SDPStrategy, FSDPStrategy,
                                         ReplicateStep)
# layout name -> the strategy that trains it
STRATEGIES: dict[str, type[Strategy]] = {**{s.name: s for s in REGISTRY if s is not ReplicateStep},
                                         **dict.fromkeys(("ddp", "tp", "zero", "local_sgd"), ReplicateStep)}


# pipeline schedules that run their own executor on the same stages (no torch schedule)
PIPELINE_EXECUTORS: dict[str, type[PipelineStrategy]] = {
    "chimera": ChimeraStrategy, "pipedream": AsyncPipelineStrategy, "pipedream_2bw": AsyncPipelineStrategy}


def strategy_class(spec: JobSpec) -> type[Strategy]:
    cls = STRATEGIES[layout_of(spec).name]
    if cls is PipelineStrategy and spec.parallel.pipeline is not None:
        return PIPELINE_EXECUTORS.get(spec.parallel.pipeline.schedule, cls)
    return cls


def build_strategy(spec: JobSpec) -> Strategy:
    return strategy_class(spec)()
