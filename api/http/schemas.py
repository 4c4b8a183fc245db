"""JSON shapes of the API's answers (plain dicts, built once per record)."""

from __future__ import annotations

from datetime import datetime, timezone

from service.db.job_reader import JobRow
from service.db.repository import METRIC_FIELDS
from service.lifecycle import JobState
from service.records import (
    AuditEntry,
    CheckpointRecord,
    EventRecord,
    JobRecord,
    MetricRecord,
    TenantRecord,
    TokenRecord,
)


def iso(ts: datetime | None) -> str | None:
    if ts is None:
        return None
    if ts.tzinfo is None:  # SQLite hands back naive UTC
        ts = ts.replace(tzinfo=timezone.utc)
    return ts.isoformat()


def job_out(job: JobRecord | JobRow, full: bool = True) -> dict:
    running = job.state == JobState.RUNNING
    eta = (job.total_steps - job.step) * job.step_time_s if running and job.step_time_s and job.total_steps else None
    out = {
        "id": job.id, "name": job.name, "state": job.state, "priority": job.priority,
        "created_at": iso(job.created_at), "updated_at": iso(job.updated_at),
        "started_at": iso(job.started_at), "finished_at": iso(job.finished_at),
        # the world size running now (a resized job's layout), else the one asked for
        "world_size": (job.layout or {}).get("world_size", job.world_size), "cpus": job.cpus, "gpus": job.gpus,
        "step": job.step, "total_steps": job.total_steps, "loss": job.loss,
        "samples_per_s": job.samples_per_s, "step_time_s": job.step_time_s, "eta_s": eta,
        "restarts": job.restarts, "last_checkpoint_step": job.last_checkpoint_step,
        # a running job's phase outside its steps: {name, done, total, unit, step, what, rank, message}
        "phase": job.phase if running else None,
        "layout": job.layout, "error": job.error, "cancel_requested": job.cancel_requested,
        "supervisor": job.supervisor_name,
        "tracking": job.tracking,  # {"mlflow": {"run_id", "experiment_id", ...}, "tensorboard": {"logdir"}}
    }
    if full:
        out["summary"] = job.summary
        out["spec"] = job.spec
    return out


def event_out(e: EventRecord) -> dict:
    return {"id": e.id, "ts": iso(e.ts), "kind": e.kind, "state": e.state, "message": e.message, "data": e.data}


def metric_out(m: MetricRecord) -> dict:
    # A program's own keys first: they never shadow a column of the series.
    return {**(m.extra or {}), "step": m.step, "ts": m.ts, **{k: getattr(m, k) for k in METRIC_FIELDS}}


def checkpoint_out(c: CheckpointRecord, available: bool) -> dict:
    return {"step": c.step, "path": c.path, "created_at": iso(c.created_at), "available": available}


def tenant_out(t: TenantRecord) -> dict:
    return {"id": t.id, "name": t.name, "created_at": iso(t.created_at), "max_workers": t.max_workers,
            "max_queued_jobs": t.max_queued_jobs, "quota_mode": t.quota_mode, "allow_user_code": t.allow_user_code,
            "weight": t.weight, "reserve_after_s": t.reserve_after_s}


def token_out(t: TokenRecord) -> dict:
    return {"id": t.id, "tenant_id": t.tenant_id, "name": t.name, "scopes": list(t.scopes),
            "created_at": iso(t.created_at), "expires_at": iso(t.expires_at), "revoked_at": iso(t.revoked_at),
            "active": t.active}


def audit_out(r: AuditEntry) -> dict:
    return {"id": r.id, "ts": iso(r.ts), "tenant_id": r.tenant_id, "token_id": r.token_id, "token_name": r.token_name,
            "action": r.action, "target": r.target, "target_tenant_id": r.target_tenant_id, "status": r.status,
            "outcome": r.outcome, "detail": r.detail}


def queue_out(reserve_after_s: float, tenants: list[dict]) -> dict:
    """GET /v1/queue; a tenant's reservation is {job, workers, since} or null."""
    for t in tenants:
        if t["reservation"] is not None:
            t["reservation"] = {**t["reservation"], "since": iso(t["reservation"]["since"])}
    return {"reserve_after_s": reserve_after_s, "tenants": tenants}


def cluster_out(nodes: list[dict], free_by_node: dict[str, dict[str, float]]) -> dict:
    """GET /v1/cluster: every node Ray lists (a dead one has nothing in all and nothing free), and the
    sums over the live ones."""
    listed = []
    total: dict[str, float] = {}
    free: dict[str, float] = {}
    for n in nodes:
        alive = bool(n.get("Alive"))
        has = {k: float(v) for k, v in (n.get("Resources") or {}).items()} if alive else {}
        left = {k: float(v) for k, v in free_by_node.get(n["NodeID"], {}).items()} if alive else {}
        listed.append({"node": n["NodeID"], "alive": alive, "total": has, "free": left})
        for k, v in has.items():
            total[k] = total.get(k, 0.0) + v
        for k, v in left.items():
            free[k] = free.get(k, 0.0) + v
    return {"nodes": listed, "total": total, "free": free}
