"""Per-rank step peaks from the ranks' records to the job's step record, the summary's
`peak_memory_bytes_per_rank` (each rank's max over measured steps) and the stored metric points."""

from __future__ import annotations

from service.db import repository as repo
from service.db import tenants as tenant_repo
from service.supervisor.aggregate import StepAggregator
from service.supervisor.step_history import StepHistory
from service.supervisor.summary import steady_steps
from tests.helpers import spec_of


def _job(s, steps: int):
    tenant = tenant_repo.ensure_tenant(s, "t").id
    return repo.create_job(s, tenant, spec_of(**{"train.steps": steps}), 0, "sha", None, max_open_jobs=100)


def _rank_record(step: int, rank: int, peak: int | None) -> dict:
    breakdown = None if peak is None else {"params": 100, "grads": 100, "optimizer": 200, "activations": peak - 400}
    return {"step": step, "rank": rank, "loss": 1.0, "step_time_s": 0.1, "compute_time_s": 0.1, "comm_time_s": 0.0,
            "samples": 4, "tokens": 64, "grad_norm": 1.0, "lr": 1e-3, "comm_bytes": 0, "model_state_bytes": 400,
            "stage": None, "skipped": False, "peak_memory_bytes": peak, "peak_memory_breakdown": breakdown,
            "peak_activation_bytes": None if peak is None else peak - 400, "ts": float(step)}


def _joined(peaks_by_step: dict[int, tuple[int | None, int | None]]) -> list[dict]:
    agg, out = StepAggregator(world_size=2, global_batch_size=8), []
    for step, peaks in peaks_by_step.items():
        for rank, peak in enumerate(peaks):
            joined = agg.add(_rank_record(step, rank, peak))
        assert joined is not None
        out.append(joined)
    return out


def test_the_summary_keeps_each_ranks_largest_measured_peak():
    steps = _joined({1: (1000, 1200), 2: (1500, 900), 3: (None, None), 4: (1100, 1300)})
    assert steps[0]["peak_memory_bytes_per_rank"] == [1000, 1200]
    assert "peak_memory_bytes_per_rank" not in steps[2]  # an unmeasured step (the CPU schedule)
    assert steps[1]["ranks"][0]["peak_memory_breakdown"]["activations"] == 1100
    assert _history(steps).peak_memory_per_rank(2) == [1500, 1300]
    assert _history(steps[2:3]).peak_memory_per_rank(2) is None
    # Steps of an earlier world size (before a resize) do not count toward the final ranks.
    assert _history(steps).peak_memory_per_rank(3) is None


def _history(steps: list[dict]) -> StepHistory:
    history = StepHistory()
    for step in steps:
        history.append(step)
    return history


def test_metric_points_carry_the_step_peaks(sessions):
    steps = _joined({1: (1000, 1200), 2: (None, None)})
    with sessions.begin() as s:
        job = _job(s, steps=2)
        repo.record_steps(s, job, steps, max_points=1000)
    with sessions() as s:
        rows = repo.list_metrics(s, job.id, 0, 100)
    assert rows[0].extra["peak_memory_bytes_per_rank"] == [1000, 1200]
    assert rows[0].extra["peak_memory_breakdown_per_rank"][1] == {"params": 100, "grads": 100, "optimizer": 200,
                                                                  "activations": 800}
    assert "peak_memory_bytes_per_rank" not in (rows[1].extra or {})  # step 2 measured no peak


def test_steps_slowed_by_the_cpu_tracker_are_left_out_of_the_steady_throughput():
    agg = StepAggregator(world_size=2, global_batch_size=8)
    steps = []
    for step in range(1, 21):
        tracked = step <= 3 or step % 10 == 0  # the CPU schedule
        for rank in range(2):
            joined = agg.add({**_rank_record(step, rank, 1000 if tracked else None), "memory_tracked": tracked})
        steps.append(joined)
    assert [s["step"] for s in steps if s["memory_tracked"]] == [1, 2, 3, 10, 20]
    assert [s["step"] for s in steady_steps(steps)] == [5, 6, 7, 8, 9, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    only_tracked = [s for s in steps if s["memory_tracked"]]
    assert steady_steps(only_tracked) == only_tracked[1:]  # nothing else to take: the warm-up rule alone
