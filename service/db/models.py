"""SQLAlchemy 2 models. The control plane is the only writer.

Timestamps are timezone-aware UTC. Tokens are stored as sha256 hashes only.
Per-step metrics are keyed by (job_id, step) so a step replayed after a
restart replaces its row instead of duplicating it.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    pass


class Tenant(Base):
    __tablename__ = "tenants"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # quotas: None = no limit of the tenant's own (the server's max_active_jobs_per_tenant still holds)
    max_workers: Mapped[int | None] = mapped_column(Integer, nullable=True)  # running workers at once
    max_queued_jobs: Mapped[int | None] = mapped_column(Integer, nullable=True)
    quota_mode: Mapped[str] = mapped_column(String(16), default="reject")  # reject (429) | queue (wait)
    allow_user_code: Mapped[bool] = mapped_column(Boolean, default=False)  # model/data entrypoints
    # fair share (service/queueing/): its share of the cluster counts as held / weight
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    reserve_after_s: Mapped[float | None] = mapped_column(Float, nullable=True)  # None = the server's setting


class ApiToken(Base):
    __tablename__ = "api_tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(64), default="")
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)  # = "admin" in scopes
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    scopes: Mapped[str] = mapped_column(String(64), default="read,submit")  # comma-separated
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("tenant_id", "idempotency_key", name="uq_jobs_tenant_idempotency_key"),
        Index("ix_jobs_queue", "state", "priority", "created_at"),
        Index("ix_jobs_tenant_created", "tenant_id", "created_at"),
        Index("ix_jobs_tenant_state", "tenant_id", "state"),
        # the scheduler's incremental reads: jobs (re)queued, and jobs ended, since its last tick
        Index("ix_jobs_queued_at", "queued_at"),
        Index("ix_jobs_finished_at", "finished_at"),
    )
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"))
    name: Mapped[str] = mapped_column(String(64))
    spec: Mapped[dict] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16))
    priority: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # when it last entered QUEUED (submit, or requeue after preemption): how long it has waited
    queued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True, default=utcnow)
    # resources the job asks of Ray, denormalised for the scheduler
    world_size: Mapped[int] = mapped_column(Integer)
    cpus: Mapped[float] = mapped_column(Float)
    gpus: Mapped[float] = mapped_column(Float, default=0.0)
    total_steps: Mapped[int] = mapped_column(Integer)
    layout: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    # progress, mirrored from the supervisor by the reconciler
    step: Mapped[int] = mapped_column(Integer, default=0)
    loss: Mapped[float | None] = mapped_column(Float, nullable=True)
    samples_per_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    step_time_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    restarts_base: Mapped[int] = mapped_column(Integer, default=0)  # restarts of earlier supervisors
    last_checkpoint_step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    summary: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    tracking: Mapped[dict | None] = mapped_column(JSON, nullable=True)  # MLflow run, TensorBoard dir (spec.tracking)
    phase: Mapped[dict | None] = mapped_column(JSON, nullable=True)  # the phase outside steps (Progress.view)
    # submit idempotency and supervisor bookkeeping
    idempotency_key: Mapped[str | None] = mapped_column(String(128), nullable=True)
    body_sha256: Mapped[str] = mapped_column(String(64))
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    supervisor_epoch: Mapped[int] = mapped_column(Integer, default=0)  # bumps per supervisor started
    supervisor_name: Mapped[str | None] = mapped_column(String(128), nullable=True)  # its Ray actor name
    drained_seq: Mapped[int] = mapped_column(Integer, default=0)  # last supervisor record stored
    # a pending preemption (service/preemption.py): the head job it makes room for, asked of this
    # supervisor epoch (a later supervisor of the job is not asked): read with the job, no event scan
    preempt_by: Mapped[str | None] = mapped_column(String(32), nullable=True)
    preempt_epoch: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # when the fair scheduler began holding capacity for this queued job (its reservation), else null;
    # written when the reservation changes (service/scheduler.py), shown by GET /v1/queue
    reserved_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class JobEvent(Base):
    __tablename__ = "job_events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    ts: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    kind: Mapped[str] = mapped_column(String(32))  # state, restart, checkpoint, cancel_requested, ...
    state: Mapped[str | None] = mapped_column(String(16), nullable=True)
    message: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict] = mapped_column(JSON, default=dict)


class JobMetric(Base):
    __tablename__ = "job_metrics"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    ts: Mapped[float] = mapped_column(Float)
    loss: Mapped[float | None] = mapped_column(Float, nullable=True)  # a program may report none
    step_time_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    samples_per_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    tokens_per_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    grad_norm: Mapped[float | None] = mapped_column(Float, nullable=True)
    lr: Mapped[float | None] = mapped_column(Float, nullable=True)
    comm_bytes: Mapped[float | None] = mapped_column(Float, nullable=True)
    bubble_fraction: Mapped[float | None] = mapped_column(Float, nullable=True)
    extra: Mapped[dict | None] = mapped_column(JSON, nullable=True)  # a program's other reported metrics


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("job_id", "step", name="uq_checkpoints_job_step"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class AuditRecord(Base):
    """One state-changing API call: who (tenant, token), what, when, on what, and how it ended."""
    __tablename__ = "audit_log"
    __table_args__ = (Index("ix_audit_tenant_id", "tenant_id", "id"),
                      Index("ix_audit_target_tenant_id", "target_tenant_id", "id"))
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    ts: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    tenant_id: Mapped[str] = mapped_column(String(32))  # the caller's tenant
    token_id: Mapped[int] = mapped_column(Integer)
    token_name: Mapped[str] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(32))  # job.submit, job.cancel, tenant.create, token.revoke, ...
    target: Mapped[str | None] = mapped_column(String(128), nullable=True)  # job, tenant or token id
    target_tenant_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    status: Mapped[int] = mapped_column(Integer)  # the HTTP status answered
    outcome: Mapped[str] = mapped_column(String(16))  # ok | denied | rejected | error
    detail: Mapped[str] = mapped_column(Text, default="")


class LeaseRow(Base):
    """One named lease (service/leases.py): who holds it, until when, under which fencing token."""
    __tablename__ = "leases"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(128))
    token: Mapped[int] = mapped_column(Integer)  # fencing token: +1 on every take-over
    expires_at: Mapped[float] = mapped_column(Float)  # seconds since the epoch, on the database's clock
