"""How one attempt (one worker group) ended: a single typed value the run loop acts on."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from workers.events import RestartCause
from workers.spec import JobSpec


class OutcomeKind(StrEnum):
    FINISHED = "finished"  # every rank trained to the last step
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"  # every rank stopped at a checkpoint step, as asked
    RESIZE = "resize"  # restart from the checkpoint just written, on another layout or placement
    FAILED = "failed"  # the group broke; the failure policy decides restart or fail


@dataclass(frozen=True)
class Outcome:
    kind: OutcomeKind
    reason: str = ""
    # FAILED
    cause: RestartCause = RestartCause.ERROR
    retryable: bool = True
    # RESIZE
    spec: JobSpec | None = None  # the layout to restart on (None: keep the current one)
    move: tuple[int, str] | None = None  # (rank, node): restart with that node excluded (straggler replace)

    @classmethod
    def finished(cls) -> Outcome:
        return cls(OutcomeKind.FINISHED, "training finished")

    @classmethod
    def cancelled(cls) -> Outcome:
        return cls(OutcomeKind.CANCELLED, "cancelled by user")

    @classmethod
    def preempted(cls) -> Outcome:
        return cls(OutcomeKind.PREEMPTED)

    @classmethod
    def failed(cls, reason: str, cause: RestartCause, retryable: bool = True) -> Outcome:
        return cls(OutcomeKind.FAILED, reason, cause=cause, retryable=retryable)

    @classmethod
    def resize(cls, reason: str, spec: JobSpec | None = None, move: tuple[int, str] | None = None) -> Outcome:
        return cls(OutcomeKind.RESIZE, reason, spec=spec, move=move)
