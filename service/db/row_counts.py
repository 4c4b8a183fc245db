"""Row counts for reporting: jobs per state (the /metrics gauges) and the size of each table."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.db.models import ApiToken, Checkpoint, Job, JobEvent, JobMetric, Tenant


def jobs_by_state(s: Session) -> dict[str, int]:
    return {state: n for state, n in s.execute(select(Job.state, func.count()).group_by(Job.state))}


def row_counts(s: Session) -> dict[str, int]:
    return {m.__tablename__: s.scalar(select(func.count()).select_from(m)) or 0
            for m in (Tenant, ApiToken, Job, JobEvent, JobMetric, Checkpoint)}
