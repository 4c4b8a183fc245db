"""The reconciler feeds each drained record to the metrics exactly once, even when a supervisor
returns records again (the control plane died between a drain and its commit)."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from service.db import repository as repo
from service.db import tenants as tenant_repo
from service.lifecycle import JobState
from service.live_metrics import LiveMetrics
from service.reconciler import Reconciler
from service.settings import Settings
from tests.helpers import spec_of
from workers.events import RestartCause, RestartEvent


def value(live: LiveMetrics, name: str, **labels) -> float | None:
    for family in text_string_to_metric_families(generate_latest(live.registry).decode()):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def step(seq: int, n: int) -> dict:
    return {"type": "step", "seq": seq, "step": n, "loss": 2.0, "step_time_s": 0.1, "samples_per_s": 160.0,
            "tokens_per_s": 1000.0, "grad_norm": 1.0, "lr": 1e-3, "comm_bytes": 10, "ts": 1.0,
            "ranks": [{"rank": 0, "compute_time_s": 0.08, "comm_time_s": 0.02, "step_time_s": 0.1, "samples": 16,
                       "straggler_score": 1.0}]}


def test_redrained_records_count_once(sessions, tmp_path):
    with sessions.begin() as s:
        tenant, _ = tenant_repo.create_tenant(s, "acme")
        job = repo.create_job(s, tenant.id, spec_of(**{"train.steps": 10}), 0, "sha", None, max_open_jobs=10)
        repo.transition(s, job, JobState.STARTING, "admitted")
        repo.transition(s, job, JobState.RUNNING, "running")
        job.supervisor_epoch = 1
        job_id = job.id
    live = LiveMetrics()
    reconciler = Reconciler(sessions, Settings(home=tmp_path), launcher=object(), metrics=live)
    drained = {"epoch": 1, "started": True, "restarts": 1, "done": False, "summary": None,
               "layout": {"world_size": 1, "dp": 1, "tp": 1, "pp": 1}, "records": [
                   step(1, 1),
                   {"type": "event", "seq": 2, "kind": "restart", "message": "worker lost",
                    "data": {"cause": "worker_lost", "restart": 1, "resume_step": 0},
                    "event": RestartEvent(1, 0, "rank 0 failed", RestartCause.WORKER_LOST, "worker lost")},
                   step(3, 2)]}
    reconciler.apply(job_id, drained)
    reconciler.apply(job_id, drained)  # the same records again: already stored, not counted again
    assert value(live, "trainyard_restarts_total", job=job_id, cause="worker_lost") == 1
    assert value(live, "trainyard_restarts_total", job=job_id, cause="hang") is None  # none until the first
    assert list(live._step_times[job_id]) == [step(1, 1)["step_time_s"], step(3, 2)["step_time_s"]]
    assert value(live, "trainyard_job_world_size", job=job_id) == 1
    assert value(live, "trainyard_rank_compute_seconds", job=job_id, stat="max") == 0.08
    assert value(live, "trainyard_slowest_rank_straggler_score", job=job_id, rank="0") == 1.0
    drained["records"].append(step(4, 3))
    reconciler.apply(job_id, drained)
    assert len(live._step_times[job_id]) == 3  # each step's time once
