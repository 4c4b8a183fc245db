"""The loss-spike / non-finite rollback policy, supervisor side.

The ranks decide a rollback themselves (workers/training/train_step.py: too many bad steps in a row)
and record it in the job's recovery ledger (workers/training/recovery.py) before they raise; the
supervisor restarts from the last checkpoint and reports what the ledger says: the bad
steps, the data window skipped and the learning-rate factor from now on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from workers.events import RestartCause, RollbackEvent


@dataclass(frozen=True)
class RollbackStatus:
    cause: RestartCause  # of the restart at hand
    resume_step: int  # the checkpoint the restart resumes from
    rollbacks: tuple[dict[str, Any], ...]  # the ledger's entries, newest last


def on_restart(status: RollbackStatus) -> RollbackEvent | None:
    """The rollback to report for this restart, or None if it is not one."""
    if status.cause != RestartCause.NON_FINITE or not status.rollbacks:
        return None
    last = status.rollbacks[-1]
    first, step = last["bad_steps"]
    window = last["data_window"]
    return RollbackEvent(from_step=step, to_step=status.resume_step, first_bad_step=first, reason=last["reason"],
                         data_window=(window[0], window[1]) if window else None, lr_scale=float(last["lr_scale"]),
                         rollback=len(status.rollbacks))
