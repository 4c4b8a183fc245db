"""What a tenant may read of its jobs and do to them, handed out as records (service/records.py).

Each function takes the caller's session; `tenant_id` confines it to that tenant's jobs
(another tenant's job is as missing as one that never was).
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from service.db import repository as repo
from service.lifecycle import TERMINAL
from service.records import CheckpointRecord, EventRecord, JobRecord, MetricRecord, copy_row


def get_job(s: Session, job_id: str, tenant_id: str) -> JobRecord | None:
    job = repo.get_job(s, job_id, tenant_id=tenant_id)
    return copy_row(JobRecord, job) if job is not None else None


def list_jobs(s: Session, tenant_id: str, state: str | None, limit: int, offset: int) -> list[JobRecord]:
    return [copy_row(JobRecord, j) for j in repo.list_jobs(s, tenant_id, state, limit, offset)]


def cancel_job(s: Session, job_id: str, tenant_id: str) -> JobRecord | None:
    """Cancel a queued job, flag a running one for its supervisor; IllegalTransition (409) for one
    that ended, None for no such job of this tenant."""
    job = repo.get_job(s, job_id, tenant_id=tenant_id, lock=True)
    if job is None:
        return None
    repo.request_cancel(s, job)
    return copy_row(JobRecord, job)


def job_ended(s: Session, job_id: str) -> bool:
    job = repo.get_job(s, job_id)
    return job is None or job.state in TERMINAL


def list_events(s: Session, job_id: str, after_id: int, limit: int) -> list[EventRecord]:
    return [copy_row(EventRecord, e) for e in repo.list_events(s, job_id, after_id, limit)]


def list_metrics(s: Session, job_id: str, after_step: int, limit: int) -> list[MetricRecord]:
    return [copy_row(MetricRecord, m) for m in repo.list_metrics(s, job_id, after_step, limit)]


def list_checkpoints(s: Session, job_id: str) -> list[CheckpointRecord]:
    return [copy_row(CheckpointRecord, c) for c in repo.list_checkpoints(s, job_id)]
