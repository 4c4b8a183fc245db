"""Job states and the one table of allowed transitions."""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    QUEUED = "QUEUED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RECOVERING = "RECOVERING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})

TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.STARTING, JobState.CANCELLED, JobState.FAILED}),
    JobState.STARTING: frozenset({JobState.RUNNING, JobState.RECOVERING, JobState.FAILED, JobState.CANCELLED}),
    # -> QUEUED: preempted (checkpointed and stopped) for a higher-priority job of the same tenant
    JobState.RUNNING: frozenset({JobState.RECOVERING, JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED,
                                 JobState.QUEUED}),
    JobState.RECOVERING: frozenset({JobState.RUNNING, JobState.FAILED, JobState.CANCELLED, JobState.QUEUED}),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


class IllegalTransition(ValueError):
    def __init__(self, current: JobState, target: JobState):
        super().__init__(f"job state cannot go from {current} to {target}; "
                         f"allowed from {current}: {sorted(TRANSITIONS[current]) or 'none (terminal)'}")
        self.current, self.target = current, target


def check_transition(current: JobState | str, target: JobState | str) -> JobState:
    current, target = JobState(current), JobState(target)
    if target not in TRANSITIONS[current]:
        raise IllegalTransition(current, target)
    return target
