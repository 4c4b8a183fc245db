"""The layouts, torch-free: which layout runs a spec, the rules of every layout's options and each one's
cost. Checking a spec (the API, `trainyard validate`, the supervisor's elastic sizing) and predicting
its memory import no strategy; the strategies (workers/parallel/registry.py) are found by name. Adding
a layout is one file here and one line in LAYOUTS, and its strategy's file and line in the registry."""

from __future__ import annotations

from collections.abc import Iterator

from workers.parallel.layouts import ddp, fsdp, local_sgd, pipeline, sdp, tensor, zero
from workers.parallel.layouts.compatibility import compatibility_violations
from workers.parallel.layouts.context import context_rules
from workers.parallel.layouts.expert import expert_rules
from workers.parallel.layouts.integrity import integrity_rules
from workers.parallel.layouts.layout import Layout, StepCapabilities
from workers.spec import JobSpec, Violation

# Asked in order: more specific layouts first.
LAYOUTS: tuple[Layout, ...] = (pipeline.LAYOUT, sdp.LAYOUT, fsdp.LAYOUT, zero.LAYOUT, tensor.LAYOUT,
                               local_sgd.LAYOUT, ddp.LAYOUT)


def layout_of(spec: JobSpec) -> Layout:
    return next(layout for layout in LAYOUTS if layout.selects(spec))


def strategy_name(spec: JobSpec) -> str:
    """The name of the layout (and strategy) that runs the spec: the supervisor's and the API's summary."""
    return layout_of(spec).name


def step_capabilities(spec: JobSpec) -> StepCapabilities:
    """What the spec's data-parallel step can take. Uneven shares also need every other axis at 1: tp, cp
    and ep ranks of one dp index must see the same samples, and a program's data is its own."""
    axes = spec.parallel.tp == spec.parallel.cp == spec.parallel.ep == 1
    return StepCapabilities(uneven_shares=axes and spec.program is None and layout_of(spec).uneven_shares(spec))


def layout_errors(spec: JobSpec) -> Iterator[Violation]:
    for layout in LAYOUTS:
        yield from layout.rules(spec)
    yield from context_rules(spec)  # the axes of every layout, not layouts
    yield from expert_rules(spec)
    yield from compatibility_violations(spec)
    yield from integrity_rules(spec)
