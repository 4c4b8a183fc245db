"""The failure policy: restart a failed worker group from its latest checkpoint, or fail the job."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from workers.events import RestartCause


class FailureAction(StrEnum):
    RESTART = "restart"
    FAIL = "fail"


@dataclass(frozen=True)
class FailureStatus:
    reason: str
    restarts_done: int
    max_restarts: int
    steps_done: int
    retryable: bool = True
    cause: RestartCause = RestartCause.ERROR


@dataclass(frozen=True)
class FailureDecision:
    action: FailureAction
    reason: str  # the sentence the restart event or the job's error says
    cause: RestartCause = RestartCause.ERROR


def on_failure(status: FailureStatus) -> FailureDecision:
    """Restart while the restart budget lasts; never for bad configuration."""
    if not status.retryable:
        why = ("the storage stayed unreachable" if status.cause == RestartCause.STORAGE
               else "configuration or user code error")
        return FailureDecision(FailureAction.FAIL, f"{status.reason}; not retryable ({why})", status.cause)
    if status.restarts_done >= status.max_restarts:
        return FailureDecision(FailureAction.FAIL, f"{status.reason}; restart budget exhausted "
                                                   f"({status.restarts_done}/{status.max_restarts})", status.cause)
    return FailureDecision(FailureAction.RESTART,
                           f"{status.reason}; restart {status.restarts_done + 1}/{status.max_restarts}", status.cause)
