"""A layout as data: its name, which specs it runs, its options' rules and its cost, all torch-free. The
strategy that runs it (workers/parallel/registry.py) is found by the name; what its data-parallel step can
take is the step's own (data_parallel_options.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from workers.parallel.layouts.accounting import LayoutCost
from workers.spec import JobSpec, Violation


@dataclass(frozen=True)
class StepCapabilities:
    """What a spec's data-parallel step can take, as typed facts (data_parallel_options.py). The
    supervisor's straggler policies act on them and the spec rules ask them; no layout reads a policy name."""

    uneven_shares: bool = False  # samples per dp rank may differ, and change between steps
    # Why they may not (a 422's reason: the field that rules them out, and how its collectives would break).
    why_not_uneven: str = "its collectives would not match"


UNEVEN_SHARES = StepCapabilities(uneven_shares=True, why_not_uneven="")


@dataclass(frozen=True)
class Layout:
    name: str
    selects: Callable[[JobSpec], bool]  # asked in LAYOUTS order: the first that selects a spec runs it
    rules: Callable[[JobSpec], Iterator[Violation]]  # checked on every spec: an option may be set elsewhere
    cost: Callable[[JobSpec, Any], LayoutCost]  # (spec, the planner's ModelFacts)
