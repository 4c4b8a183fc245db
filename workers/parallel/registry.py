"""The strategy registry: from the layout that runs a spec (workers/parallel/layouts/, torch-free: which
layout, its rules, its cost) to the strategy that trains it, by name. Adding a strategy is one file and
one line here, beside its layout's file and line in LAYOUTS (tests/workers/test_strategy_registry.py).
Layouts "ddp", "tp", "zero", "local_sgd" and "fsdp" (HSDP included) are one data-parallel step built from the
spec's DataParallelOptions (workers/parallel/data_parallel/): the replicate step, or the shard step for the
options' kind "fsdp". The layout name stays, for reporting."""

from __future__ import annotations

from workers.parallel.base import Strategy
from workers.parallel.data_parallel.replicate import ReplicateStep
from workers.parallel.data_parallel.shard import ShardStep
from workers.parallel.layouts import layout_of
from workers.parallel.layouts.data_parallel_options import DataParallelKind, DataParallelOptions
from workers.parallel.parameter_server.strategy import ParameterServerStrategy
from workers.parallel.pipeline.async_1f1b import AsyncPipelineStrategy
from workers.parallel.pipeline.chimera import ChimeraStrategy
from workers.parallel.pipeline.strategy import PipelineStrategy
from workers.parallel.sdp.strategy import SDPStrategy
from workers.spec import JobSpec

# The data-parallel step's kinds (DataParallelOptions.kind) -> the step that runs them; "sdp" is still its own
# strategy (workers/parallel/sdp/).
DATA_PARALLEL_STEPS: dict[DataParallelKind, type[ReplicateStep] | type[ShardStep]] = {
    **dict.fromkeys(("replicate", "zero1", "zero2", "local_sgd"), ReplicateStep), "fsdp": ShardStep}

REGISTRY: tuple[type[Strategy], ...] = (ParameterServerStrategy, PipelineStrategy, SDPStrategy, ShardStep,
                                         ReplicateStep)
# layout name -> the strategy that trains it
STRATEGIES: dict[str, type[Strategy]] = {
    "parameter_server": ParameterServerStrategy, "pipeline": PipelineStrategy, "sdp": SDPStrategy,
    **dict.fromkeys(("ddp", "tp", "zero", "local_sgd"), ReplicateStep), "fsdp": ShardStep}
DATA_PARALLEL_LAYOUTS = frozenset(name for name, cls in STRATEGIES.items() if cls in (ReplicateStep, ShardStep))


# pipeline schedules that run their own executor on the same stages (no torch schedule)
PIPELINE_EXECUTORS: dict[str, type[PipelineStrategy]] = {
    "chimera": ChimeraStrategy, "pipedream": AsyncPipelineStrategy, "pipedream_2bw": AsyncPipelineStrategy}


def data_parallel_step(options: DataParallelOptions) -> ReplicateStep | ShardStep:
    """The data-parallel step of these options (its kind picks replicate or shard)."""
    return DATA_PARALLEL_STEPS[options.kind](options)


def strategy_class(spec: JobSpec) -> type[Strategy]:
    name = layout_of(spec).name
    if name in DATA_PARALLEL_LAYOUTS:
        return DATA_PARALLEL_STEPS[DataParallelOptions.of(spec).kind]
    cls = STRATEGIES[name]
    if cls is PipelineStrategy and spec.parallel.pipeline is not None:
        return PIPELINE_EXECUTORS.get(spec.parallel.pipeline.schedule, cls)
    return cls


def build_strategy(spec: JobSpec) -> Strategy:
    if layout_of(spec).name in DATA_PARALLEL_LAYOUTS:
        return data_parallel_step(DataParallelOptions.of(spec))
    return strategy_class(spec)()
