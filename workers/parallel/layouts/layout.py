"""A layout as data: its name, which specs it runs, its options' rules and its cost, all torch-free. The
strategy that runs it (workers/parallel/registry.py) is found by the name."""

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
