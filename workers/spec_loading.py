"""Loading a submitted spec: `parallel: auto` becomes the planner's choice, so the stored spec is
explicit, then every rule is checked (workers/spec_checks.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from workers.spec import JobSpec, SpecError, Violation
from workers.spec_checks import checked_spec
from workers.spec_file import read_spec_file


def parse_spec(data: Any, *, allow_fault_injection: bool | None = None) -> JobSpec:
    if isinstance(data, dict) and data.get("parallel") == "auto" and data.get("program") is not None:
        raise SpecError([Violation("parallel", "parallel: 'auto' plans Trainyard's own loop; a program "
                                               "takes explicit degrees (parallel: {dp: .., tp: ..})")])
    if isinstance(data, dict) and data.get("parallel") == "auto":
        from workers.parallel.planner import resolve_auto  # torch: only when a plan is asked for

        data = {**data, "parallel": resolve_auto(data)}
    return checked_spec(data, allow_fault_injection=allow_fault_injection)


def load_spec(path: str | Path, **kwargs: Any) -> JobSpec:
    """Read a YAML or JSON spec file (workers/spec_file.py: a syntax error is a one-line SpecFileError)."""
    return parse_spec(read_spec_file(path), **kwargs)
