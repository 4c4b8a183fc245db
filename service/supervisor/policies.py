"""Supervisor policies: small functions from a status to a decision, testable without a cluster."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Action(StrEnum):
    RESTART = "restart"
    FAIL = "fail"


@dataclass(frozen=True)
class FailureStatus:
    reason: str
    restarts_done: int
    max_restarts: int
    steps_done: int
    retryable: bool = True


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str


def on_failure(status: FailureStatus) -> Decision:
    """Restart from the latest checkpoint while the restart budget lasts; never for bad configuration."""
    if not status.retryable:
        return Decision(Action.FAIL, f"{status.reason}; not retryable (configuration or user code error)")
    if status.restarts_done >= status.max_restarts:
        return Decision(Action.FAIL, f"{status.reason}; restart budget exhausted "
                                     f"({status.restarts_done}/{status.max_restarts})")
    return Decision(Action.RESTART, f"{status.reason}; restart {status.restarts_done + 1}/{status.max_restarts}")
