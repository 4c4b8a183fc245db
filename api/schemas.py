"""JSON shapes of the API's answers (plain dicts, built once per row)."""

from __future__ import annotations

from datetime import datetime, timezone

from service.db.models import Checkpoint, Job, JobEvent, JobMetric
from service.db.repository import METRIC_FIELDS
from service.lifecycle import JobState


def iso(ts: datetime | None) -> str | None:
    if ts is None:
        return None
    if ts.tzinfo is None:  # SQLite hands back naive UTC
        ts = ts.replace(tzinfo=timezone.utc)
    return ts.isoformat()


def job_out(job: Job, full: bool = True) -> dict:
    running = job.state == JobState.RUNNING
    eta = (job.total_steps - job.step) * job.step_time_s if running and job.step_time_s else None
    out = {
        "id": job.id, "name": job.name, "state": job.state, "priority": job.priority,
        "created_at": iso(job.created_at), "updated_at": iso(job.updated_at),
        "started_at": iso(job.started_at), "finished_at": iso(job.finished_at),
        # the world size running now (a resized job's layout), else the one asked for
        "world_size": (job.layout or {}).get("world_size", job.world_size), "cpus": job.cpus, "gpus": job.gpus,
        "step": job.step, "total_steps": job.total_steps, "loss": job.loss,
        "samples_per_s": job.samples_per_s, "step_time_s": job.step_time_s, "eta_s": eta,
        "restarts": job.restarts, "last_checkpoint_step": job.last_checkpoint_step,
        "layout": job.layout, "error": job.error, "cancel_requested": job.cancel_requested,
        "supervisor": job.supervisor_name,
    }
    if full:
        out["summary"] = job.summary
        out["spec"] = job.spec
    return out


def event_out(e: JobEvent) -> dict:
    return {"id": e.id, "ts": iso(e.ts), "kind": e.kind, "state": e.state, "message": e.message, "data": e.data}


def metric_out(m: JobMetric) -> dict:
    return {"step": m.step, "ts": m.ts, **{k: getattr(m, k) for k in METRIC_FIELDS}}


def checkpoint_out(c: Checkpoint, available: bool) -> dict:
    return {"step": c.step, "path": c.path, "created_at": iso(c.created_at), "available": available}
