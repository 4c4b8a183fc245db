"""A supervisor's step history stays bounded whatever the run's length (issue: 1.2-2.9 MiB a step at
4,096 ranks, kept for the whole run), and the summary's figures it feeds stay right."""

from __future__ import annotations

import statistics

from bench.fleet.sizes import deep_size
from service.supervisor.aggregate import StepAggregator
from service.supervisor.step_history import MAX_SAMPLES, RECENT, StepHistory


def _joined(agg: StepAggregator, step: int, ranks: int, peak: int | None = None) -> dict:
    joined = None
    for rank in range(ranks):
        joined = agg.add({"step": step, "rank": rank, "loss": 10.0 / step, "step_time_s": 0.5 + step % 3 * 0.1,
                          "compute_time_s": 0.4, "comm_time_s": 0.1, "samples": 4, "tokens": 256, "grad_norm": 1.0,
                          "lr": 1e-3, "comm_bytes": 1000 + step, "model_state_bytes": 1 << 20, "stage": None,
                          "skipped": False, "peak_memory_bytes": None if peak is None else peak + rank,
                          "ts": float(step)})
    assert joined is not None
    return joined


def test_memory_is_flat_over_thousands_of_steps():
    agg, history, ranks = StepAggregator(64, 256), StepHistory(), 64
    sizes = {}
    for step in range(1, 8001):
        history.append(_joined(agg, step, ranks))
        if step in (1000, 8000):
            sizes[step] = deep_size(history)
    per_step = (sizes[8000] - sizes[1000]) / 7000
    assert per_step <= 64, sizes  # bytes per step after warm-up: the sample is capped, not the run
    assert len(history.recent) == RECENT and len(history) < MAX_SAMPLES
    steps = [s["step"] for s in history]
    assert steps[0] <= 8 and steps[-1] >= 7990 - history.stride  # the sample still spans the whole run
    assert history.first is not None and history.first["loss"] == 10.0 and history.last_step == 8000


def test_a_replay_after_a_restart_replaces_what_followed_and_peaks_stay_exact():
    agg, history = StepAggregator(2, 8), StepHistory()
    for step in range(1, 11):
        history.append(_joined(agg, step, 2, peak=1000 * step))
    for step in range(7, 9):  # resumed from the checkpoint at step 6
        history.append(_joined(agg, step, 2, peak=5))
    assert history.last_step == 8 and [s["step"] for s in history][-3:] == [6, 7, 8]
    assert history.peak_memory_per_rank(2) == [10_000, 10_001]  # each rank's highest, replays included
    assert history.peak_memory_per_rank(4) is None  # no step of that world size


def test_the_sample_gives_the_exact_median_of_a_short_run():
    agg, history = StepAggregator(4, 16), StepHistory()
    for step in range(1, 101):
        history.append(_joined(agg, step, 4))
    assert statistics.median(s["comm_bytes"] for s in history) == statistics.median(1000 + s for s in range(1, 101))
    assert "ranks" not in history.first  # compact: no per-rank entries kept beyond the newest few
