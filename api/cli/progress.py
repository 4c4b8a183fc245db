"""A live progress bar for one job: step/total, loss, samples/s, ETA."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
)


class RunProgress:
    def __init__(self, total_steps: int, console: Console):
        self.console = console
        self.progress = Progress(
            TextColumn("[bold]{task.fields[state]:<10}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[rate]} samples/s"),
            TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=False,
        )
        self.task = self.progress.add_task("train", total=total_steps or None, state="STARTING", loss="-", rate="-")

    def __enter__(self) -> "RunProgress":
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def on_state(self, state, message: str) -> None:
        self.progress.update(self.task, state=str(state))
        self.console.log(f"{state}: {message}")

    def on_event(self, event) -> None:
        if event.kind != "checkpoint":
            self.console.log(f"{event.kind}: {event.message}")

    def on_step(self, record: dict) -> None:
        rate = record.get("samples_per_s")
        self.progress.update(self.task, completed=record["step"], loss=f"{record['loss']:.4f}",
                             rate=f"{rate:,.0f}" if rate else "-")
