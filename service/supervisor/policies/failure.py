"""The failure policy: restart a failed worker group from its latest checkpoint, or fail the job.

Two budgets, over the whole job (every supervisor it had): `max_restarts` for the job's own
failures, `max_infra_restarts` for the cluster's (a lost node or supervisor). A soak with node
losses spent a healthy job's whole `max_restarts` on faults it did not cause (bench/soak)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from workers.events import RestartCause
from workers.spec import FaultToleranceSpec


class FailureAction(StrEnum):
    RESTART = "restart"
    FAIL = "fail"


@dataclass(frozen=True)
class RestartsUsed:
    """Restarts the job has had so far, by the budget each was charged to."""

    job: int = 0
    infra: int = 0

    @property
    def total(self) -> int:
        return self.job + self.infra

    def charged(self, cause: RestartCause) -> int:
        return self.infra if cause.infrastructure else self.job

    def plus(self, cause: RestartCause) -> RestartsUsed:
        return replace(self, infra=self.infra + 1) if cause.infrastructure else replace(self, job=self.job + 1)


def budget(limits: FaultToleranceSpec, cause: RestartCause) -> tuple[str, int]:
    """The spec key that bounds restarts of this cause, and its value."""
    if cause.infrastructure:
        return "max_infra_restarts", limits.max_infra_restarts
    return "max_restarts", limits.max_restarts


@dataclass(frozen=True)
class FailureStatus:
    reason: str
    used: RestartsUsed
    limits: FaultToleranceSpec
    steps_done: int
    retryable: bool = True
    cause: RestartCause = RestartCause.ERROR


@dataclass(frozen=True)
class FailureDecision:
    action: FailureAction
    reason: str  # the sentence the restart event or the job's error says
    cause: RestartCause = RestartCause.ERROR


def on_failure(status: FailureStatus) -> FailureDecision:
    """Restart while the cause's budget lasts; never for bad configuration, nor after running out of memory
    (the same layout on the same machines would run out again: the job fails at once, its budget untouched)."""
    if status.cause == RestartCause.OUT_OF_MEMORY:
        return FailureDecision(FailureAction.FAIL, f"{status.reason}; not retryable (out of memory)", status.cause)
    if not status.retryable:
        why = ("the storage stayed unreachable" if status.cause == RestartCause.STORAGE
               else "configuration or user code error")
        return FailureDecision(FailureAction.FAIL, f"{status.reason}; not retryable ({why})", status.cause)
    key, limit = budget(status.limits, status.cause)
    done = status.used.charged(status.cause)
    if done >= limit:
        return FailureDecision(FailureAction.FAIL, f"{status.reason}; restart budget exhausted "
                                                   f"({key} {done}/{limit})", status.cause)
    return FailureDecision(FailureAction.RESTART, f"{status.reason}; restart {done + 1}/{limit} ({key})",
                           status.cause)
