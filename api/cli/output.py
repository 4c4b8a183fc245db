"""What every `trainyard` command prints with: the two consoles and how a refused API call is shown."""

from __future__ import annotations

import typer
from rich.console import Console

from api.cli.client import ApiFailure

out = Console()
err = Console(stderr=True)


def fail(exc: ApiFailure) -> typer.Exit:
    """Print a refused call (status, message, each field's rule) and the exit to raise: 2 for
    an invalid request (422), else 1."""
    err.print(f"[red]error{f' {exc.status}' if exc.status else ''}:[/red] {exc.message}")
    for e in exc.errors:
        if e.get("message") and e["message"] not in exc.message:
            err.print(f"  {e['message']}")
    return typer.Exit(2 if exc.status == 422 else 1)


def steps_of(job: dict) -> str:
    """'12/100'; a program's total is unknown (0): '12'."""
    return f"{job['step']}/{job['total_steps']}" if job["total_steps"] else str(job["step"])
