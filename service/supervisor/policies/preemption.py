"""The preemption policy: how a run makes room for a higher-priority job.

Every rank stops at its next checkpoint step (they agree on it, workers/training/trainer.py), so the
job resumes from that checkpoint when it is admitted again; a group not started yet is not
started at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class PreemptionAction(StrEnum):
    NONE = "none"
    REQUEUE = "requeue"  # end the attempt now: nothing runs that would need a checkpoint
    ASK_STOP = "ask_stop"  # ask the ranks to stop at their next checkpoint step


@dataclass(frozen=True)
class PreemptionStatus:
    requested: bool
    group_running: bool
    stop_sent: bool = False


def on_preemption(status: PreemptionStatus) -> PreemptionAction:
    if not status.requested:
        return PreemptionAction.NONE
    if not status.group_running:
        return PreemptionAction.REQUEUE
    return PreemptionAction.NONE if status.stop_sent else PreemptionAction.ASK_STOP
