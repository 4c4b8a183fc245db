"""An async parameter-server job loses a trainer and trains on (issue 50): the others keep stepping to the
last step with the shards never restored, the job ends SUCCEEDED with a shrink event naming the lost
trainer, rank 0 included (its lead then validates and exports); no `trainyard-ps-*` actor outlives a job
that succeeded, failed or was cancelled. Real Ray, gloo, a tiny DLRM (tests/workers/test_parameter_server_jobs.py
has the sync/bounded/async runs without faults)."""

from __future__ import annotations

import threading
import time

import pytest

from tests.helpers import Events, alive_actors, wait_until, with_overrides
from tests.workers.test_parameter_server_jobs import DLRM_SPEC
from workers.spec_loading import parse_spec

ASYNC_SPEC = {
    **DLRM_SPEC, "name": "dlrm-async",
    "parallel": {"parameter_server": {"shards": 2, "mode": "async"}},
    "checkpoint": {"every_steps": 20},
    "fault_tolerance": {"max_restarts": 0},  # a restart would hide a lost trainer the job did not survive
}


def spec_with(**changes):
    return parse_spec(with_overrides(ASYNC_SPEC, changes), allow_fault_injection=True)


def shard_actors() -> list[dict]:
    return [a for a in alive_actors() if (a.get("Name") or "").startswith("trainyard-ps-")]


def run_job(spec, job_dir, listener=None):
    from service.supervisor.run import JobRun

    listener = listener or Events()
    return JobRun(spec, job_dir, job_dir.name, listener=listener).run(), listener


def mean_loss(steps: list[dict], which: slice) -> float:
    chosen = steps[which]
    return sum(s["loss"] for s in chosen) / len(chosen)


def assert_trained_on_without(lost: int, summary: dict, events: Events) -> None:
    assert summary["state"] == "SUCCEEDED", summary.get("error")
    assert summary["restarts"] == 0  # the shards were never restored from a checkpoint
    assert not [kind for kind, _ in events.events if kind == "restart"]
    shrinks = [data for kind, data in events.events if kind == "resize"]
    assert len(shrinks) == 1 and f"trainer {lost} lost" in shrinks[0]["reason"], shrinks
    assert shrinks[0]["from"]["world_size"] == 2 and shrinks[0]["to"]["world_size"] == 1
    assert summary["world_size"] == 1 and summary["parameter_server"]["lost_trainers"] == [lost]
    assert summary["steps"] == 40  # the survivor stepped to the last step
    steps = events.steps
    assert [s["step"] for s in steps] == list(range(1, 41))
    assert mean_loss(steps, slice(-5, None)) < mean_loss(steps, slice(0, 5))
    assert summary["final_val_auc"] is not None and summary["params_sha256"]  # the lead validated, exported
    assert wait_until(lambda: not shard_actors(), 30), shard_actors()


def test_an_async_trainer_lost_leaves_the_other_training_to_the_end(ray_cluster, tmp_path):
    spec = spec_with(fault_injection=[{"at_step": 12, "rank": 1, "kind": "crash"}])
    summary, events = run_job(spec, tmp_path / "lost-1")
    assert_trained_on_without(1, summary, events)


@pytest.mark.exhaustive  # another ~30 s job; make test covers a lost trainer by rank 1's above
def test_an_async_rank_0_lost_leaves_the_shards_and_the_other_training(ray_cluster, tmp_path):
    # Rank 0 started the shards: detached, they outlive it; rank 1 leads the checkpoints, validation, export.
    spec = spec_with(fault_injection=[{"at_step": 12, "rank": 0, "kind": "crash"}])
    summary, events = run_job(spec, tmp_path / "lost-0")
    assert_trained_on_without(0, summary, events)
    assert (tmp_path / "lost-0" / "parameter_server" / "step-00000020.pt").exists()  # written by rank 1


@pytest.mark.exhaustive  # another ~40 s job
def test_an_elastic_async_job_re_adds_a_lost_trainer_to_the_running_shards(ray_cluster, tmp_path, monkeypatch):
    from service.supervisor.run import JobRun

    # resources.max_workers makes it elastic: the lost trainer's place is taken by a new rank that pulls
    # the shards' current state and trains on; no restart, no restore. Slowed from step 13 (the node's
    # ranks, 3x), so that the steps left outlast the new rank's start.
    monkeypatch.setattr(JobRun, "rejoin_after_s", 0.5)
    spec = spec_with(**{"train.steps": 120, "resources.min_workers": 1, "resources.max_workers": 2},
                     fault_injection=[{"at_step": 12, "rank": 1, "kind": "crash"},
                                      {"at_step": 13, "rank": 0, "kind": "slow", "factor": 3.0}])
    summary, events = run_job(spec, tmp_path / "rejoined")
    assert summary["state"] == "SUCCEEDED", summary.get("error")
    assert summary["restarts"] == 0 and not [kind for kind, _ in events.events if kind == "restart"]
    resizes = [data for kind, data in events.events if kind == "resize"]
    assert len(resizes) == 2, resizes
    assert "trainer 1 lost" in resizes[0]["reason"] and resizes[0]["to"]["world_size"] == 1
    assert "trainer 1 joined the running shards" in resizes[1]["reason"] and resizes[1]["to"]["world_size"] == 2
    assert summary["world_size"] == 2 and summary["parameter_server"]["lost_trainers"] == []
    steps = events.steps
    assert [s["step"] for s in steps] == list(range(1, 121))
    assert [r["rank"] for r in steps[-1]["ranks"]] == [0, 1]  # the joined rank reports its steps again
    assert any(len(s["ranks"]) == 1 for s in steps)  # ... which went on without it meanwhile
    assert mean_loss(steps, slice(-5, None)) < mean_loss(steps, slice(0, 5))
    assert wait_until(lambda: not shard_actors(), 30), shard_actors()


@pytest.mark.exhaustive  # another ~20 s job
def test_below_min_workers_a_lost_trainer_fails_the_job_and_leaves_no_shard(ray_cluster, tmp_path):
    spec = spec_with(**{"resources.min_workers": 2, "resources.max_workers": 2},
                     fault_injection=[{"at_step": 12, "rank": 1, "kind": "crash"}])
    summary, events = run_job(spec, tmp_path / "floor")
    assert summary["state"] == "FAILED"
    assert not [kind for kind, _ in events.events if kind == "resize"]
    assert wait_until(lambda: not shard_actors(), 30), shard_actors()


@pytest.mark.exhaustive  # another ~20 s job
def test_a_cancelled_async_job_leaves_no_shard(ray_cluster, tmp_path):
    from service.supervisor.run import JobRun

    spec = spec_with(**{"train.steps": 400})
    run = JobRun(spec, tmp_path / "cancelled", "cancelled", listener=Events())
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(run.run()))
    thread.start()
    assert wait_until(lambda: len(shard_actors()) == 2, 120), "the shards never started"
    time.sleep(1.0)
    run.cancel()
    thread.join(timeout=120)
    assert result["state"] == "CANCELLED"
    assert wait_until(lambda: not shard_actors(), 30), shard_actors()
