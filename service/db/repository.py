"""Every query and write the control plane makes, in one place.

Each function takes a Session and leaves committing to the caller's unit of
work (`with sessions.begin():`), so a rejected request writes nothing.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from collections.abc import Iterable

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from service.db.models import ApiToken, Checkpoint, Job, JobEvent, JobMetric, Tenant, utcnow
from service.lifecycle import TERMINAL, JobState, check_transition
from workers.spec import JobSpec

ACTIVE = (JobState.STARTING, JobState.RUNNING, JobState.RECOVERING)
METRIC_FIELDS = ("loss", "step_time_s", "samples_per_s", "tokens_per_s", "grad_norm", "lr", "comm_bytes",
                 "bubble_fraction")


class QuotaExceeded(Exception):
    pass


class IdempotencyConflict(Exception):
    pass


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return "ty_" + secrets.token_urlsafe(32)


# --- tenants and tokens ----------------------------------------------------


def ensure_tenant(s: Session, name: str) -> Tenant:
    tenant = s.scalar(select(Tenant).where(Tenant.name == name))
    if tenant is None:
        tenant = Tenant(id=uuid.uuid4().hex[:16], name=name)
        s.add(tenant)
        s.flush()
    return tenant


def ensure_token(s: Session, tenant: Tenant, token: str, name: str, is_admin: bool) -> None:
    digest = hash_token(token)
    if s.scalar(select(ApiToken.id).where(ApiToken.token_sha256 == digest)) is None:
        s.add(ApiToken(tenant_id=tenant.id, token_sha256=digest, name=name, is_admin=is_admin))
        s.flush()


def create_tenant(s: Session, name: str) -> tuple[Tenant, str]:
    """A new tenant with its first (non-admin) token; the token is returned once and stored hashed."""
    if s.scalar(select(Tenant.id).where(Tenant.name == name)) is not None:
        raise IdempotencyConflict(f"name: tenant {name!r} already exists")
    tenant = ensure_tenant(s, name)
    token = new_token()
    ensure_token(s, tenant, token, "default", is_admin=False)
    return tenant, token


def lookup_token(s: Session, token: str) -> tuple[str, bool] | None:
    row = s.execute(select(ApiToken.tenant_id, ApiToken.is_admin)
                    .where(ApiToken.token_sha256 == hash_token(token))).first()
    return (row[0], bool(row[1])) if row else None


# --- jobs ------------------------------------------------------------------


def find_by_idempotency_key(s: Session, tenant_id: str, key: str) -> Job | None:
    return s.scalar(select(Job).where(Job.tenant_id == tenant_id, Job.idempotency_key == key))


def count_open_jobs(s: Session, tenant_id: str) -> int:
    open_states = [JobState.QUEUED, *ACTIVE]
    return s.scalar(select(func.count()).select_from(Job)
                    .where(Job.tenant_id == tenant_id, Job.state.in_(open_states))) or 0


def quota_message(limit: int) -> str:
    return f"tenant has {limit} queued or running jobs (the limit); wait for some to finish or cancel them"


def create_job(s: Session, tenant_id: str, spec: JobSpec, priority: int, body_sha256: str,
               idempotency_key: str | None, max_open_jobs: int | None) -> Job:
    """A QUEUED job and its first event. max_open_jobs=None: the caller checked the quota already."""
    if max_open_jobs is not None and count_open_jobs(s, tenant_id) >= max_open_jobs:
        raise QuotaExceeded(quota_message(max_open_jobs))
    r = spec.resources
    job = Job(id=uuid.uuid4().hex[:16], tenant_id=tenant_id, name=spec.name, spec=spec.model_dump(mode="json"),
              state=JobState.QUEUED, priority=priority, world_size=spec.world_size,
              cpus=r.cpus_per_worker * spec.world_size, gpus=r.gpus_per_worker * spec.world_size,
              total_steps=spec.train.steps, idempotency_key=idempotency_key, body_sha256=body_sha256)
    s.add(job)
    s.flush()
    add_event(s, job.id, "state", "job accepted", state=JobState.QUEUED, data={"to": "QUEUED"})
    return job


def get_job(s: Session, job_id: str, tenant_id: str | None = None, lock: bool = False) -> Job | None:
    q = select(Job).where(Job.id == job_id)
    if tenant_id is not None:
        q = q.where(Job.tenant_id == tenant_id)
    if lock:
        q = q.with_for_update()
    return s.scalar(q)


def list_jobs(s: Session, tenant_id: str, state: str | None, limit: int, offset: int) -> list[Job]:
    q = select(Job).where(Job.tenant_id == tenant_id)
    if state:
        q = q.where(Job.state == state)
    return list(s.scalars(q.order_by(Job.created_at.desc(), Job.id).limit(limit).offset(offset)))


def queued_jobs(s: Session, limit: int = 1000) -> list[Job]:
    """The queue in admission order: highest priority first, then first come first served."""
    q = select(Job).where(Job.state == JobState.QUEUED, Job.cancel_requested.is_(False))
    return list(s.scalars(q.order_by(Job.priority.desc(), Job.created_at, Job.id).limit(limit)))


def active_jobs(s: Session) -> list[Job]:
    return list(s.scalars(select(Job).where(Job.state.in_(ACTIVE)).order_by(Job.created_at)))


def transition(s: Session, job: Job, target: JobState, message: str, data: dict | None = None) -> None:
    """Move a job along the lifecycle table (IllegalTransition otherwise) and record it as an event."""
    previous = job.state
    job.state = check_transition(job.state, target)
    now = utcnow()
    job.updated_at = now
    if target == JobState.STARTING and job.started_at is None:
        job.started_at = now
    if target in TERMINAL:
        job.finished_at = now
    add_event(s, job.id, "state", message, state=target, data={"from": str(previous), "to": str(target), **(data or {})})


def request_cancel(s: Session, job: Job) -> None:
    """QUEUED jobs are cancelled at once; running ones are flagged for the reconciler to stop."""
    if job.state == JobState.QUEUED:
        transition(s, job, JobState.CANCELLED, "cancelled by user before it started")
        return
    check_transition(job.state, JobState.CANCELLED)  # 409 for a terminal job
    if not job.cancel_requested:
        job.cancel_requested = True
        job.updated_at = utcnow()
        add_event(s, job.id, "cancel_requested", "cancel requested by user")


# --- events, metrics, checkpoints -----------------------------------------


def add_event(s: Session, job_id: str, kind: str, message: str, state: str | None = None,
              data: dict | None = None, ts=None) -> None:
    s.add(JobEvent(job_id=job_id, kind=kind, message=message, state=state, data=data or {}, ts=ts or utcnow()))


def list_events(s: Session, job_id: str, after_id: int, limit: int) -> list[JobEvent]:
    q = select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.id > after_id)
    return list(s.scalars(q.order_by(JobEvent.id).limit(limit)))


def metric_stride(total_steps: int, max_points: int) -> int:
    """Keep every k-th step so a job stores at most ~max_points rows, whatever its length."""
    return max(1, -(-total_steps // max_points))


def record_steps(s: Session, job: Job, records: Iterable[dict], max_points: int) -> None:
    stride = metric_stride(job.total_steps, max_points)
    kept = [r for r in records if r["step"] % stride == 0 or r["step"] == job.total_steps]
    if not kept:
        return
    # A step replayed after a restart from a checkpoint replaces the row it had.
    s.execute(delete(JobMetric).where(JobMetric.job_id == job.id, JobMetric.step.in_([r["step"] for r in kept])))
    s.add_all(JobMetric(job_id=job.id, step=r["step"], ts=r.get("ts") or 0.0,
                        **{k: r.get(k) for k in METRIC_FIELDS}) for r in kept)


def list_metrics(s: Session, job_id: str, after_step: int, limit: int) -> list[JobMetric]:
    q = select(JobMetric).where(JobMetric.job_id == job_id, JobMetric.step > after_step)
    return list(s.scalars(q.order_by(JobMetric.step).limit(limit)))


def record_checkpoint(s: Session, job_id: str, step: int, path: str) -> None:
    exists = s.scalar(select(Checkpoint.id).where(Checkpoint.job_id == job_id, Checkpoint.step == step))
    if exists is None:
        s.add(Checkpoint(job_id=job_id, step=step, path=path))


def list_checkpoints(s: Session, job_id: str) -> list[Checkpoint]:
    return list(s.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step)))


# --- reporting -------------------------------------------------------------


def jobs_by_state(s: Session) -> dict[str, int]:
    return {state: n for state, n in s.execute(select(Job.state, func.count()).group_by(Job.state))}


def row_counts(s: Session) -> dict[str, int]:
    return {m.__tablename__: s.scalar(select(func.count()).select_from(m)) or 0
            for m in (Tenant, ApiToken, Job, JobEvent, JobMetric, Checkpoint)}
