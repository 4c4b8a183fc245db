"""Plain, frozen records of what the service stores: what it hands the API instead of ORM rows.

A record is copied from its row while the session is open, so a caller can keep it after
the transaction ends and can never write through it by accident.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from datetime import datetime, timezone
from typing import Any, TypeVar

R = TypeVar("R")


def _aware(ts: datetime | None) -> datetime | None:
    """SQLite hands back naive UTC; make it comparable with aware times."""
    return ts.replace(tzinfo=timezone.utc) if ts is not None and ts.tzinfo is None else ts


def copy_row(cls: type[R], row: Any, **overrides: Any) -> R:
    """`cls` filled from the row's attributes of the same names."""
    values = {f.name: getattr(row, f.name) for f in fields(cls) if f.name not in overrides}  # type: ignore[arg-type]
    return cls(**values, **overrides)


@dataclass(frozen=True)
class JobRecord:
    id: str
    tenant_id: str
    name: str
    spec: dict
    state: str
    priority: int
    created_at: datetime | None
    updated_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    world_size: int
    cpus: float
    gpus: float
    total_steps: int
    layout: dict | None
    step: int
    loss: float | None
    samples_per_s: float | None
    step_time_s: float | None
    restarts: int
    last_checkpoint_step: int | None
    error: str | None
    summary: dict | None
    tracking: dict | None
    phase: dict | None  # the running job's phase outside its steps (validation, upload, export, ...)
    cancel_requested: bool
    supervisor_name: str | None


@dataclass(frozen=True)
class EventRecord:
    id: int
    ts: datetime | None
    kind: str
    state: str | None
    message: str
    data: dict


@dataclass(frozen=True)
class MetricRecord:
    step: int
    ts: float
    loss: float | None  # None: a program that reports no loss
    step_time_s: float | None
    samples_per_s: float | None
    tokens_per_s: float | None
    grad_norm: float | None
    lr: float | None
    comm_bytes: float | None
    bubble_fraction: float | None
    extra: dict | None  # a program's other reported metrics


@dataclass(frozen=True)
class CheckpointRecord:
    step: int
    path: str
    created_at: datetime | None


@dataclass(frozen=True)
class TenantRecord:
    id: str
    name: str
    created_at: datetime | None
    max_workers: int | None
    max_queued_jobs: int | None
    quota_mode: str
    allow_user_code: bool
    weight: float  # fair share (service/queueing/)
    reserve_after_s: float | None  # None: the server's TRAINYARD_RESERVE_AFTER_S


@dataclass(frozen=True)
class TokenRecord:
    """A token without its secret; `active`: neither revoked nor expired when it was read."""

    id: int
    tenant_id: str
    name: str
    scopes: tuple[str, ...]
    created_at: datetime | None
    expires_at: datetime | None
    revoked_at: datetime | None
    active: bool

    @classmethod
    def of(cls, row: Any, now: datetime | None = None) -> TokenRecord:
        expires = _aware(row.expires_at)
        active = row.revoked_at is None and (expires is None or expires > (now or datetime.now(timezone.utc)))
        return copy_row(cls, row, scopes=tuple(x for x in row.scopes.split(",") if x), expires_at=expires,
                        active=active)


@dataclass(frozen=True)
class AuditEntry:
    id: int
    ts: datetime | None
    tenant_id: str
    token_id: int
    token_name: str
    action: str
    target: str | None
    target_tenant_id: str | None
    status: int
    outcome: str
    detail: str


@dataclass(frozen=True)
class Principal:
    """The caller of a request: the tenant and token it authenticated as, and the token's scopes."""

    tenant_id: str
    token_id: int
    token_name: str
    scopes: frozenset[str]
    expires_at: datetime | None = None

    @property
    def is_admin(self) -> bool:
        return "admin" in self.scopes

    def expired(self, now: datetime | None = None) -> bool:
        return self.expires_at is not None and self.expires_at <= (now or datetime.now(timezone.utc))
