"""The layouts, torch-free: which layout runs a spec, the rules of every layout's options and each one's
cost. Checking a spec (the API, `trainyard validate`, the supervisor's elastic sizing) and predicting
its memory import no strategy; the strategies (workers/parallel/registry.py) are found by name. Adding
a layout is one file here and one line in LAYOUTS, and its strategy's file and line in the registry."""

from __future__ import annotations

from collections.abc import Iterator

from workers.parallel.layouts import ddp, fsdp, local_sgd, parameter_server, pipeline, sdp, tensor, zero
from workers.parallel.layouts.compatibility import compatibility_violations
from workers.parallel.layouts.context import context_rules
from workers.parallel.layouts.data_parallel_options import DataParallelOptions
from workers.parallel.layouts.expert import expert_rules
from workers.parallel.layouts.integrity import integrity_rules
from workers.parallel.layouts.layout import Layout, StepCapabilities
from workers.spec import JobSpec, Violation

# Asked in order: more specific layouts first.
LAYOUTS: tuple[Layout, ...] = (parameter_server.LAYOUT, pipeline.LAYOUT, sdp.LAYOUT, fsdp.LAYOUT, zero.LAYOUT,
                               tensor.LAYOUT, local_sgd.LAYOUT, ddp.LAYOUT)


def layout_of(spec: JobSpec) -> Layout:
    return next(layout for layout in LAYOUTS if layout.selects(spec))


def strategy_name(spec: JobSpec) -> str:
    """The name of the layout (and strategy) that runs the spec: the supervisor's and the API's summary."""
    return layout_of(spec).name


def step_capabilities(spec: JobSpec) -> StepCapabilities:
    """What the spec's data-parallel step can take (its options' own answer)."""
    return DataParallelOptions.of(spec).capabilities


def step_need_violations(spec: JobSpec) -> Iterator[Violation]:
    """A straggler policy that needs uneven shares (StragglerSpec.needs_uneven_shares) on a step that cannot
    take them: refused, with the step's own reason. The only place a spec's straggler policy meets its layout."""
    straggler = spec.supervisor.straggler
    capabilities = step_capabilities(spec)
    if straggler.needs_uneven_shares and not capabilities.uneven_shares:
        yield Violation("supervisor.straggler.policy",
            f"supervisor.straggler.policy {straggler.policy!r} needs a data-parallel step that takes uneven shares "
            f"of the global batch, but {capabilities.why_not_uneven}; use 'report' or 'replace'")


def layout_errors(spec: JobSpec) -> Iterator[Violation]:
    for layout in LAYOUTS:
        yield from layout.rules(spec)
    yield from step_need_violations(spec)
    yield from context_rules(spec)  # the axes of every layout, not layouts
    yield from expert_rules(spec)
    yield from compatibility_violations(spec)
    yield from integrity_rules(spec)
