"""What each tenant holds now (its queued and running jobs, their workers, CPUs and GPUs) and the
row locks that serialise a tenant's submits while its quota is checked against that usage
(service/quotas.py). Like service/db/repository.py, each function takes a Session and leaves
committing to the caller.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.db.models import Job, Tenant
from service.db.repository import ACTIVE
from service.lifecycle import JobState


@dataclass
class Usage:
    """What one tenant holds now: its queued jobs and their workers, its running ones' workers."""

    queued: int
    active: int
    queued_workers: int
    active_workers: int

    @property
    def open_jobs(self) -> int:
        return self.queued + self.active

    def add_queued(self, workers: int) -> None:
        self.queued += 1
        self.queued_workers += workers


def tenant_usage(s: Session, tenant_id: str) -> Usage:
    return tenants_usage(s, [tenant_id])[tenant_id]


def tenants_usage(s: Session, tenant_ids: list[str]) -> dict[str, Usage]:
    rows = s.execute(select(Job.tenant_id, Job.state, func.count(), func.coalesce(func.sum(Job.world_size), 0))
                     .where(Job.tenant_id.in_(tenant_ids), Job.state.in_([JobState.QUEUED, *ACTIVE]))
                     .group_by(Job.tenant_id, Job.state)).all()
    usage = {tenant_id: Usage(0, 0, 0, 0) for tenant_id in tenant_ids}
    for tenant_id, state, n, workers in rows:
        if state == JobState.QUEUED:
            usage[tenant_id].queued, usage[tenant_id].queued_workers = n, int(workers)
        else:
            usage[tenant_id].active += n
            usage[tenant_id].active_workers += int(workers)
    return usage


def active_workers_by_tenant(s: Session) -> dict[str, int]:
    rows = s.execute(select(Job.tenant_id, func.sum(Job.world_size))
                     .where(Job.state.in_(ACTIVE)).group_by(Job.tenant_id))
    return {tenant_id: int(n or 0) for tenant_id, n in rows}


def lock_tenant(s: Session, tenant_id: str) -> Tenant | None:
    """Serialises a tenant's submits (row lock on PostgreSQL; SQLite has one writer anyway).
    FOR NO KEY UPDATE: other transactions' foreign-key checks on the tenant (their job and audit
    inserts) do not wait for it."""
    return s.get(Tenant, tenant_id, with_for_update={"key_share": True})


def lock_tenants(s: Session, tenant_ids: list[str]) -> list[Tenant]:
    """lock_tenant for several tenants in one statement, locked in id order."""
    return list(s.scalars(select(Tenant).where(Tenant.id.in_(tenant_ids)).order_by(Tenant.id)
                          .with_for_update(key_share=True)))


def holdings_by_tenant(s: Session) -> dict[str, tuple[float, float, int]]:
    """Tenant id -> the CPUs, GPUs and workers its admitted (starting or running) jobs hold."""
    rows = s.execute(select(Job.tenant_id, func.sum(Job.cpus), func.sum(Job.gpus), func.sum(Job.world_size))
                     .where(Job.state.in_(ACTIVE)).group_by(Job.tenant_id))
    return {tenant_id: (float(c or 0), float(g or 0), int(w or 0)) for tenant_id, c, g, w in rows}
