"""The strategy registry: the one ordered table from a spec's layout to the strategy that runs it.

Each strategy says itself whether it runs a spec (`selects`), which rules its options obey
(`spec_errors`) and what its layout costs (`cost`). The first strategy in `REGISTRY` that
selects a spec runs it, so more specific layouts come first; every strategy's rules are checked
on every spec, since an option may be set where its strategy does not run. Adding a strategy
is one new file and one line here, and one in selection.py (the torch-free name of the
strategy a spec selects, for the supervisor and the API; tests/workers/test_strategy_selection.py).
"""

from __future__ import annotations

from collections.abc import Iterator

from workers.parallel.base import Strategy
from workers.parallel.ddp import DDPStrategy
from workers.parallel.fsdp import FSDPStrategy
from workers.parallel.local_sgd import LocalSGDStrategy
from workers.parallel.pipeline.strategy import PipelineStrategy
from workers.parallel.replicas import integrity_errors
from workers.parallel.sdp.strategy import SDPStrategy
from workers.parallel.tensor_parallel import TensorParallelStrategy
from workers.parallel.zero import ZeroStrategy
from workers.spec import JobSpec, Violation

REGISTRY: tuple[type[Strategy], ...] = (
    PipelineStrategy,  # pp > 1 (x dp, x tp)
    SDPStrategy,  # parallel.sdp, also with zero 3 per subnetwork
    FSDPStrategy,  # zero 3, also FSDP x TP and HSDP
    ZeroStrategy,  # zero 1/2 over dp
    TensorParallelStrategy,  # tp > 1 with zero 0 (DP x TP)
    LocalSGDStrategy,  # parameter averaging every parallel.local_sgd.period steps
    DDPStrategy,  # plain data parallelism, with parallel.compression as its communication hook
)
STRATEGIES: dict[str, type[Strategy]] = {s.name: s for s in REGISTRY}


def strategy_class(spec: JobSpec) -> type[Strategy]:
    return next(s for s in REGISTRY if s.selects(spec))


def build_strategy(spec: JobSpec) -> Strategy:
    return strategy_class(spec)()


def layout_errors(spec: JobSpec) -> Iterator[Violation]:
    for strategy in REGISTRY:
        yield from strategy.spec_errors(spec)
    selected = strategy_class(spec)
    yield from integrity_errors(spec, selected.name, selected.replicas(spec))
