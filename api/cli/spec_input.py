"""How the commands that read a spec file (run, validate, plan, submit) read it: a file that cannot be
read or parsed, and a spec that breaks rules, are refused with one line per problem and exit 2,
never a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from api.cli.output import err
from workers.spec import SPEC_ERRORS, JobSpec, format_validation_error
from workers.spec_file import SpecFileError, read_spec_file
from workers.spec_loading import load_spec


def refuse(label: str, *lines: str) -> typer.Exit:
    """Print each problem on a line of its own (never wrapped, so one problem stays one line) and
    the exit to raise: 2, a refused spec."""
    for line in lines:
        err.print(f"[red]{label}[/red] {escape(line)}", soft_wrap=True)
    return typer.Exit(2)


def read_spec_data_or_exit(path: Path) -> dict[str, Any]:
    """The spec file's mapping as written (YAML or JSON), not yet checked."""
    try:
        return read_spec_file(path)
    except SpecFileError as exc:
        raise refuse("cannot read spec", str(exc)) from None


def read_spec_or_exit(path: Path, allow_fault_injection: bool | None = None) -> JobSpec:
    """The spec file checked against every rule."""
    try:
        return load_spec(path, allow_fault_injection=allow_fault_injection)
    except SpecFileError as exc:
        raise refuse("cannot read spec", str(exc)) from None
    except SPEC_ERRORS as exc:
        raise refuse("invalid spec", *(e["message"] for e in format_validation_error(exc))) from None
    except ValueError as exc:  # a model the planner could not count for `parallel: auto`, say
        raise refuse("invalid spec", f"{path}: {' '.join(str(exc).split())}") from None


def refuse_if_too_big(spec: JobSpec, on_this_host: bool) -> None:
    """Exit 2, as for any refused spec, when the predicted peak per worker exceeds resources.memory_per_worker_gib
    or (`on_this_host`: its workers run here) this host's memory (workers/parallel/memory_fit.py)."""
    from workers.parallel.memory_fit import host_budget, memory_violation, spec_budget

    too_big = memory_violation(spec, [spec_budget(spec), host_budget() if on_this_host else None])
    if too_big is not None:
        raise refuse("invalid spec", too_big.message)
