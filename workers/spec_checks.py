"""A submitted spec, checked whole: each field (pydantic), the rules that span fields
(workers/spec/rules.py) and the layouts' own (workers/parallel/layouts/), all torch-free,
reported together: a spec with field errors is also checked, without those fields, against the
rules its other fields break (workers/spec_repair.py)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from workers.parallel.layouts import layout_errors, step_need_violations
from workers.spec import JobSpec, SpecError, Violation, rule_violations
from workers.spec.messages import field_violations
from workers.spec_repair import spec_without, unaffected


def spec_violations(spec: JobSpec, *, allow_fault_injection: bool | None = None) -> list[Violation]:
    rules = list(rule_violations(spec, allow_fault_injection=allow_fault_injection))
    if spec.program is not None:
        # a program's layout is only the mesh it is handed; the strategies' rules are about our loop
        return [*rules, *step_need_violations(spec)]
    return [*rules, *layout_errors(spec)]


def checked_spec(data: Any, *, allow_fault_injection: bool | None = None) -> JobSpec:
    """The JobSpec of `data` with an explicit layout; raises SpecError naming every field."""
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        rest, removed = spec_without(data, exc)
        others = spec_violations(rest, allow_fault_injection=allow_fault_injection) if rest is not None else []
        raise SpecError([*field_violations(exc), *unaffected(others, removed)]) from exc
    violations = spec_violations(spec, allow_fault_injection=allow_fault_injection)
    if violations:
        raise SpecError(violations)
    return spec
