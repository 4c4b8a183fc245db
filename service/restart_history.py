"""The restarts a job has had, over every supervisor it had, by the budget each was charged to.

Read from the job's stored `restart` events: a replacement supervisor (after a lost one, or after a
preemption) starts with these, so `max_restarts` bounds the job, not each supervisor (the soak saw a
job RECOVERING after 7 restarts with `max_restarts: 6`)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db.models import JobEvent
from service.supervisor.policies.failure import RestartsUsed
from workers.events import RestartCause


def restarts_used(s: Session, job_id: str) -> RestartsUsed:
    used = RestartsUsed()
    for data in s.scalars(select(JobEvent.data).where(JobEvent.job_id == job_id, JobEvent.kind == "restart")):
        try:
            cause = RestartCause((data or {}).get("cause", RestartCause.ERROR))
        except ValueError:  # a cause this version does not know: the job's own budget
            cause = RestartCause.ERROR
        used = used.plus(cause)
    return used
