"""How a JobRun reports what happens: state changes, typed events and job-level step records."""

from __future__ import annotations

from typing import Any, Protocol

from service.lifecycle import JobState
from workers.events import RunEvent


class RunListener(Protocol):
    def on_state(self, state: JobState, message: str) -> None: ...
    def on_event(self, event: RunEvent) -> None: ...
    def on_step(self, record: dict[str, Any]) -> None: ...


class SilentListener:
    def on_state(self, state: JobState, message: str) -> None:
        pass

    def on_event(self, event: RunEvent) -> None:
        pass

    def on_step(self, record: dict[str, Any]) -> None:
        pass
