"""A layout as data: its name, which specs it runs, its options' rules, its cost and what its data-parallel
step can take, all torch-free. The strategy that runs it (workers/parallel/registry.py) is found by the name."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from workers.parallel.layouts.accounting import LayoutCost
from workers.spec import JobSpec, Violation


@dataclass(frozen=True)
class StepCapabilities:
    """What a spec's data-parallel step can take, as typed facts (workers/parallel/layouts/__init__.py). The
    supervisor's straggler policies act on them and the spec rules ask them; no layout reads a policy name."""

    uneven_shares: bool = False  # samples per dp rank may differ, and change between steps
    # Why they may not (a 422's reason: the field that rules them out, and how its collectives would break).
    why_not_uneven: str = "its collectives would not match"


UNEVEN_SHARES = StepCapabilities(uneven_shares=True, why_not_uneven="")


def even_shares_only(why: str) -> Callable[[JobSpec], StepCapabilities]:
    """A layout whose step needs the same micro-batch count on every dp rank, and the reason why."""
    return lambda spec: StepCapabilities(why_not_uneven=why.format(p=spec.parallel))


@dataclass(frozen=True)
class Layout:
    name: str
    selects: Callable[[JobSpec], bool]  # asked in LAYOUTS order: the first that selects a spec runs it
    rules: Callable[[JobSpec], Iterator[Violation]]  # checked on every spec: an option may be set elsewhere
    cost: Callable[[JobSpec, Any], LayoutCost]  # (spec, the planner's ModelFacts)
    # What its data-parallel step can take. Uneven shares (data-parallel ranks running different micro-batch
    # counts in one step) only where the step reduces gradients once per step, weighting each rank by its
    # samples.
    step: Callable[[JobSpec], StepCapabilities] = even_shares_only("its collectives would not match")
