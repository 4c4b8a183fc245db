"""Straggler detection: pure policy on hand-built numbers, then the real thing on Ray."""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys

import pytest

from service.supervisor import excluded_nodes
from service.supervisor.policies.stragglers.rebalance import rebalanced_shares
from service.supervisor.policies.stragglers.replace import on_slow_rank, slots_off
from service.supervisor.policies.stragglers.status import StragglerStatus
from service.supervisor.run import JobRun
from service.supervisor.stragglers import StragglerDetector
from tests.helpers import Events, spec_of
from workers.spec import SPEC_ERRORS, FaultSpec, StragglerSpec, format_validation_error
from workers.storage import Storage
from workers.training.faults import FaultInjector, slow_runs

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
@pytest.mark.exhaustive  # make test: the same rebalance over REST (test_end_to_end)
def test_slow_rank_is_rebalanced_live_and_the_ranks_even_out(ray_cluster, tmp_path):
    runs = {}
    for policy in ("report", "rebalance"):  # the same slow rank, the same data: a reference, then the rebalance
        rec = Events()
        spec = spec_of(**{"resources.workers": 2, "train.steps": 80, "train.global_batch_size": 32,
                          "model.d_model": 64, "checkpoint.every_steps": 0, "supervisor.straggler.policy": policy,
                          "supervisor.straggler.window": 5},
                       fault_injection=[{"at_step": 5, "rank": 1, "kind": "slow", "factor": 3.0}])
        summary = JobRun(spec, tmp_path / policy, policy, rec).run()
        runs[policy] = rec
        assert summary["state"] == "SUCCEEDED" and summary["restarts"] == 0
    rec = runs["rebalance"]
    assert "RECOVERING" not in rec.states and rec.states.count("RUNNING") == 1  # no restart, no checkpoint needed

    straggler = [d for k, d in rec.events if k == "straggler"]
    assert straggler and straggler[0]["rank"] == 1 and straggler[0]["step"] <= 5 + 5 + 3
    assert straggler[0]["action"].startswith("rebalancing the global batch from [16, 16] to")
    rebalances = [d for k, d in rec.events if k == "rebalance"]  # a second one refines the split, if still slow
    first, last = rebalances[0], rebalances[-1]
    # The ranks switch at an agreement step (a multiple of the window) soon after the request.
    assert first["from"] == [16, 16] and first["step"] % 5 == 0 and first["step"] <= straggler[0]["step"] + 10
    assert first["shares"][1] < first["shares"][0] and sum(first["shares"]) == 32

    by_step = {r["step"]: r for r in rec.steps}
    assert [r["samples"] for r in by_step[first["step"]]["ranks"]] == [16, 16]
    assert all([r["samples"] for r in by_step[s]["ranks"]] == last["shares"] for s in range(last["step"] + 1, 81))
    # An uneven split keeps the global-batch mean: the loss curve is the reference's.
    reference = {r["step"]: r["loss"] for r in runs["report"].steps}
    assert all(by_step[s]["loss"] == pytest.approx(reference[s], rel=1e-5) for s in range(1, 81))

    def imbalance(steps):  # slowest / fastest rank's compute (CPU) time: what the rebalance evens out
        return statistics.median(max(r["compute_time_s"] for r in by_step[s]["ranks"])
                                 / min(r["compute_time_s"] for r in by_step[s]["ranks"]) for s in steps)

    # Measured x2.9-3.1 -> x1.1-1.8 here. CPU time, unlike wall-clock throughput, does not move
    # with the host's load (the full suite once showed samples/s x0.84 for a run that did even out);
    # the throughput gain is measured beside the `report` policy by bench/recovery.py.
    before, after = imbalance(range(6, first["step"] + 1)), imbalance(range(last["step"] + 1, 81))
    assert before > 2.0 and after - 1 < (before - 1) / 2, f"compute imbalance x{before:.2f} -> x{after:.2f}"


def _status(**overrides):
    base = dict(rank=1, node="node-b", step=20, world_size=2, slots_elsewhere=2)
    return StragglerStatus(**{**base, **overrides})


def test_replace_needs_room_off_the_slow_node_and_waits_out_its_cooldown():
    assert on_slow_rank(_status()).replace
    assert not on_slow_rank(_status(slots_elsewhere=1)).replace  # nowhere to go: only reported
    assert not on_slow_rank(_status(pending=True)).replace  # one replacement at a time
    cooling = on_slow_rank(_status(last_replace_step=10, cooldown=16))
    assert not cooling.replace and "next from step 26" in cooling.action
    assert on_slow_rank(_status(step=26, last_replace_step=10, cooldown=16)).replace
    # Room off the slow node counts the job's own ranks on the other nodes and free slots there.
    assert slots_off(["a", "b"], {"a": 0, "b": 0, "c": 1}, {"b"}) == 2
    assert slots_off(["a", "a"], {"a": 0, "b": 0}, {"a"}) == 0


@pytest.mark.exhaustive  # make test: a straggler rebalanced live over REST (test_end_to_end)
@pytest.mark.slow
def test_slow_rank_is_replaced_on_another_node_and_throughput_recovers(tmp_path):
    out = tmp_path / "replace.json"
    env = {**os.environ, "TRAINYARD_RAY_ADDRESS": ""}
    proc = subprocess.run([sys.executable, "-m", "tests.service.replace_scenario", str(out)],
                          capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())

    clean = result["clean"]
    assert clean["summary"]["state"] == "SUCCEEDED"
    assert [e["kind"] for e in clean["events"] if e["kind"].startswith("straggler") or e["kind"] == "replace"] == []

    slow = result["slow"]
    assert slow["summary"]["state"] == "SUCCEEDED" and slow["summary"]["restarts"] == 0
    stragglers = [e["data"] for e in slow["events"] if e["kind"] == "straggler"]
    assert [s["rank"] for s in stragglers] == [1]  # flagged once, never again on the new node
    assert stragglers[0]["step"] <= 5 + 6 + 3 and stragglers[0]["action"].startswith("replacing rank 1")
    [move] = [e["data"] for e in slow["events"] if e["kind"] == "replace"]
    assert move["rank"] == 1 and move["from_node"] == slow["slow_node"]
    assert move["to_node"] in result["nodes"] and move["to_node"] != move["from_node"]
    assert move["from_node"] not in move["nodes"]  # no rank went back to the degraded node

    # A new supervisor of the job (here: after it finished) keeps the degraded node excluded.
    resumed = result["resumed"]
    assert resumed["avoid_nodes"] == [slow["slow_node"]] and resumed["summary"]["state"] == "SUCCEEDED"
    assert [e["data"]["nodes"] for e in resumed["events"] if e["kind"] == "excluded_nodes"] == [[slow["slow_node"]]]

    # Records in arrival order: the slow node's steps (from the fault on) before the move, the new
    # node's after it (skipping the first few after the restart).
    [moved] = [e for e in slow["events"] if e["kind"] == "replace"]
    before, after = slow["steps"][:moved["after"]], slow["steps"][moved["after"]:]
    slow_phase = [s["samples_per_s"] for s in before if s["step"] >= 6 and not s["partial"]]
    replaced = [s["samples_per_s"] for s in after[3:] if not s["partial"]]
    assert slow_phase and len(replaced) >= 30
    speedup = statistics.median(replaced) / statistics.median(slow_phase)
    # x2-3 on a quiet host (the slow node is left behind); gate only on a gain, which a loaded host shrinks.
    assert speedup > 1.0, f"throughput x{speedup:.2f} after replacing the slow rank"


def test_a_slow_fault_stays_with_the_node_it_struck_not_with_the_rank(tmp_path):
    faults = [FaultSpec(at_step=5, rank=1, kind="slow", factor=3.0)]
    on_b = FaultInjector(faults, 1, tmp_path, node="node-b")
    assert on_b.slow_factor(4) == 1.0 and on_b.slow_factor(5) == 3.0  # strikes node-b at step 5
    assert FaultInjector(faults, 1, tmp_path, node="node-b").slow_factor(9) == 3.0  # restarted there: still slow
    assert FaultInjector(faults, 1, tmp_path, node="node-c").slow_factor(9) == 1.0  # moved off it: not slow
    assert FaultInjector(faults, 0, tmp_path, node="node-b").slow_factor(9) == 1.0  # other ranks never were
    # Each attempt of the slow rank recorded where it ran, for a verdict on its detection (bench/soak).
    runs = slow_runs(Storage.of(tmp_path / "faults"), 0)
    assert [(r.node, r.degraded, r.step) for r in runs] == [("node-b", True, 5), ("node-b", True, 9),
                                                            ("node-c", False, 9)]


def test_replace_needs_checkpoints_to_resume_from():
    with pytest.raises(SPEC_ERRORS) as exc:
        spec_of(**{"supervisor.straggler.policy": "replace"})
    [error] = format_validation_error(exc.value)
    assert error["field"] == "supervisor.straggler.policy" and "checkpoint.every_steps > 0" in error["message"]
    assert spec_of(**{"supervisor.straggler.policy": "replace", "checkpoint.every_steps": 5})


def test_excluded_nodes_are_kept_for_the_jobs_next_supervisor(tmp_path):
    assert JobRun(spec_of(), tmp_path, "j").avoid_nodes == set()
    excluded_nodes.save(tmp_path, {"node-b", "node-a"})
    assert JobRun(spec_of(), tmp_path, "j").avoid_nodes == {"node-a", "node-b"}
    assert JobRun(spec_of(), tmp_path / "other-job", "k").avoid_nodes == set()
