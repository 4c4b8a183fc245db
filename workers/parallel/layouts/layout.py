"""A layout as data: its name, which specs it runs, its options' rules, its cost and what its data-parallel
step can take, all torch-free. The strategy that runs it (workers/parallel/registry.py) is found by the name."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from workers.parallel.layouts.accounting import LayoutCost
from workers.spec import JobSpec, Violation


@dataclass(frozen=True)
class Layout:
    name: str
    selects: Callable[[JobSpec], bool]  # asked in LAYOUTS order: the first that selects a spec runs it
    rules: Callable[[JobSpec], Iterator[Violation]]  # checked on every spec: an option may be set elsewhere
    cost: Callable[[JobSpec, Any], LayoutCost]  # (spec, the planner's ModelFacts)
    # Whether data-parallel ranks may run different micro-batch counts in one step: true only where the
    # step reduces gradients once per step, weighting each rank by its samples (the supervisor's
    # straggler policies consult it through `StepCapabilities`; no strategy reads a policy name).
    uneven_shares: Callable[[JobSpec], bool] = lambda spec: False


@dataclass(frozen=True)
class StepCapabilities:
    """What a spec's data-parallel step can take, as typed facts (workers/parallel/layouts/__init__.py)."""

    uneven_shares: bool = False  # samples per dp rank may differ, and change between steps
