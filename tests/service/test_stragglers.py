"""Straggler detection: pure policy on hand-built numbers, then the real thing on Ray."""

from __future__ import annotations

import random
import statistics

import pytest

from service.supervisor.run import JobRun
from service.supervisor.stragglers import StragglerDetector, rebalanced_shares
from tests.helpers import Events, spec_of
from workers.spec import StragglerSpec

CONFIG = StragglerSpec(threshold=0.6, recover=0.8, window=5)


def test_noise_raises_no_straggler():
    rng = random.Random(0)
    detector = StragglerDetector(4, CONFIG)
    changes = [c for step in range(500)
               for c in detector.observe(step, [0.1 * rng.uniform(0.8, 1.25) for _ in range(4)])]
    assert changes == []


def test_slow_rank_is_flagged_within_the_window_and_recovers_with_hysteresis():
    detector = StragglerDetector(3, CONFIG)
    flagged = [c for step in range(10) for c in detector.observe(step, [0.1, 0.3, 0.1])]
    assert [(c.rank, c.slow, c.step) for c in flagged] == [(1, True, 4)]  # the first full window
    assert detector.scores()[1] == pytest.approx(1 / 3)
    # Back to 0.7 of the median: above the threshold but below `recover`, so still slow.
    assert [c for step in range(10, 20) for c in detector.observe(step, [0.1, 0.14, 0.1])] == []
    recovered = [c for step in range(20, 30) for c in detector.observe(step, [0.1, 0.1, 0.1])]
    assert [(c.rank, c.slow) for c in recovered] == [(1, False)]


def test_a_rank_blocked_on_others_is_not_blamed():
    # Compute time excludes waiting; equal compute means no straggler even if step times differ.
    detector = StragglerDetector(2, CONFIG)
    assert [c for step in range(20) for c in detector.observe(step, [0.1, 0.1])] == []


@pytest.mark.parametrize("times,expected", [([1, 3], [24, 8]), ([1, 1, 1, 3], [10, 10, 9, 3]), ([1, 1], [16, 16])])
def test_rebalanced_shares_follow_speed_and_sum_to_the_global_batch(times, expected):
    assert rebalanced_shares(32, times) == expected


@pytest.mark.slow
def test_clean_run_raises_no_straggler_events(ray_cluster, tmp_path):
    rec = Events()
    spec = spec_of(**{"resources.workers": 2, "train.steps": 60, "model.d_model": 64})
    assert JobRun(spec, tmp_path / "clean", "clean", rec).run()["state"] == "SUCCEEDED"
    assert [k for k, _ in rec.events if k.startswith("straggler")] == []
    assert all(r["straggler_score"] is not None for r in rec.steps[-1]["ranks"])


@pytest.mark.slow
def test_slow_rank_is_rebalanced_and_throughput_recovers(ray_cluster, tmp_path):
    rec = Events()
    spec = spec_of(**{"resources.workers": 2, "train.steps": 80, "train.global_batch_size": 32,
                      "model.d_model": 64, "checkpoint.every_steps": 15, "supervisor.straggler.policy": "rebalance",
                      "supervisor.straggler.window": 5},
                   fault_injection=[{"at_step": 5, "rank": 1, "kind": "slow", "factor": 3.0}])
    summary = JobRun(spec, tmp_path / "slow", "slow", rec).run()
    assert summary["state"] == "SUCCEEDED" and summary["restarts"] == 0

    straggler = [d for k, d in rec.events if k == "straggler"]
    assert straggler and straggler[0]["rank"] == 1 and straggler[0]["step"] <= 5 + 5 + 3
    [rebalance] = [d for k, d in rec.events if k == "rebalance"]
    assert rebalance["shares"][1] < rebalance["shares"][0] and sum(rebalance["shares"]) == 32

    by_step = {r["step"]: r for r in rec.steps}
    slow_phase = [by_step[s]["samples_per_s"] for s in range(6, 16)]
    balanced = [by_step[s]["samples_per_s"] for s in range(30, 81)]
    speedup = statistics.median(balanced) / statistics.median(slow_phase)
    # x1.3-2 when the host is quiet; a loaded host (the full suite) has shown x1.04, so only
    # "it got faster" is gated here and the size of the gain is left to bench/recovery.py.
    assert speedup > 1.0, f"throughput x{speedup:.2f} after rebalancing"
