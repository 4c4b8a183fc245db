"""MFU on a job's metric points (the console's MFU chart): 6 x parameters FLOPs per token at the step's
token rate, against every worker's peak FLOP/s; a step without a known peak (a CPU worker) has no `mfu`."""

from __future__ import annotations

import pytest

from service.db import repository as repo
from service.db import tenants as tenant_repo
from service.supervisor.aggregate import StepAggregator
from tests.helpers import spec_of

PARAMS = 1_000_000


def _rank_record(step: int, rank: int, peak: float | None) -> dict:
    return {"step": step, "rank": rank, "loss": 1.0, "step_time_s": 0.1, "compute_time_s": 0.1, "comm_time_s": 0.0,
            "samples": 4, "tokens": 64, "grad_norm": 1.0, "lr": 1e-3, "comm_bytes": 0, "model_state_bytes": 400,
            "stage": None, "skipped": False, "peak_flops_per_s": peak, "model_params": PARAMS, "ts": float(step)}


def _joined(step: int, peaks: tuple[float | None, ...]) -> dict:
    agg = StepAggregator(world_size=len(peaks), global_batch_size=8)
    joined = None
    for rank, peak in enumerate(peaks):
        joined = agg.add(_rank_record(step, rank, peak))
    assert joined is not None
    return joined


def test_mfu_is_model_flops_at_the_step_rate_over_the_workers_peak():
    step = _joined(1, (1e12, 1e12))
    # 2 ranks x 64 tokens in 0.1 s = 1,280 tokens/s; 6 x 1e6 x 1,280 FLOP/s over 2 x 1e12 peak
    assert step["tokens_per_s"] == pytest.approx(1280.0)
    assert step["mfu"] == pytest.approx(6 * PARAMS * 1280.0 / 2e12)
    # The slowest worker's peak counts when they differ (the job is held to the smaller device)
    assert _joined(1, (1e12, 2e12))["mfu"] == pytest.approx(step["mfu"])


def test_a_cpu_step_or_one_worker_without_a_peak_has_no_mfu():
    assert "mfu" not in _joined(1, (None, None))  # CPU: no peak FLOP/s is known
    assert "mfu" not in _joined(1, (1e12, None))  # known only if every worker's is


def test_the_stored_point_carries_mfu_and_a_cpu_point_does_not(sessions):
    gpu, cpu = _joined(1, (1e12, 1e12)), _joined(2, (None, None))
    with sessions.begin() as s:
        tenant = tenant_repo.ensure_tenant(s, "t").id
        job = repo.create_job(s, tenant, spec_of(**{"train.steps": 2}), 0, "sha", None, max_open_jobs=100)
        repo.record_steps(s, job, [gpu, cpu], max_points=1000)
    with sessions() as s:
        rows = repo.list_metrics(s, job.id, 0, 100)
    assert rows[0].extra["mfu"] == pytest.approx(gpu["mfu"])  # GET /v1/jobs/{id}/metrics puts extra on the point
    assert "mfu" not in (rows[1].extra or {})
