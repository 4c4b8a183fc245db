"""What GET /v1/queue shows: each tenant's weight, fair share now, the workers its admitted jobs hold,
its queued jobs, and the job the fair scheduler holds capacity for (its reservation), read from the
database in a few aggregate statements (the reservation is the `reserved_at` mark the leader's
scheduler writes when it changes: service/scheduler.py)."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.db import tenant_usage as usage_repo
from service.db import tenants as tenant_repo
from service.db.models import Job
from service.lifecycle import JobState
from service.queueing import Resources, TenantState


def queue_view(s: Session, total: Resources, tenant_id: str | None = None) -> list[dict]:
    """One entry per tenant (only `tenant_id`'s if given), in the tenants' creation order. `total`:
    the cluster's size, the fair shares' denominator (zero while it is not known: every share 0)."""
    tenants = [t for t in tenant_repo.list_tenants(s) if tenant_id is None or t.id == tenant_id]
    held = usage_repo.holdings_by_tenant(s)
    queued_q = select(Job.tenant_id, func.count()).where(Job.state == JobState.QUEUED).group_by(Job.tenant_id)
    reserved_q = select(Job.tenant_id, Job.id, Job.world_size, Job.reserved_at).where(
        Job.state == JobState.QUEUED, Job.reserved_at.is_not(None))
    if tenant_id is not None:
        queued_q = queued_q.where(Job.tenant_id == tenant_id)
        reserved_q = reserved_q.where(Job.tenant_id == tenant_id)
    queued = {tid: n for tid, n in s.execute(queued_q)}
    reserved = {tid: (job_id, workers, since) for tid, job_id, workers, since in s.execute(reserved_q)}
    out = []
    for t in tenants:
        cpus, gpus, workers = held.get(t.id, (0.0, 0.0, 0))
        state = TenantState(t.id, t.weight or 1.0, t.max_workers, t.reserve_after_s, cpus, gpus, workers)
        job = reserved.get(t.id)
        out.append({"tenant": t.name, "weight": state.weight, "fair_share": state.share(total),
                    "running_workers": workers, "queued": int(queued.get(t.id, 0)),
                    "reservation": {"job": job[0], "workers": job[1], "since": job[2]} if job else None})
    return out
