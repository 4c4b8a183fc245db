"""Numerics and integrity: non-finite steps are skipped or rolled back, corrupted replicas restored."""

from __future__ import annotations

import pytest
import ray

from service.supervisor.run import JobRun
from tests.helpers import Events, spec_of
from workers.events import RestartCause
from workers.runtime.group import restart_cause
from workers.training.trainer import NonFiniteTraining, SilentDataCorruption

pytestmark = pytest.mark.slow

BASE = {"resources.workers": 2, "train.steps": 12, "checkpoint.every_steps": 5}


def run(tmp_path, name, faults=(), **overrides):
    rec = Events()
    summary = JobRun(spec_of(**{**BASE, **overrides}, fault_injection=list(faults)), tmp_path / name, name, rec).run()
    return summary, rec


@pytest.fixture(scope="module")
def clean(ray_cluster, tmp_path_factory):
    summary, _ = run(tmp_path_factory.mktemp("clean"), "clean")
    assert summary["state"] == "SUCCEEDED"
    return summary


def test_a_nan_step_is_skipped_and_training_goes_on(clean, tmp_path):
    summary, rec = run(tmp_path, "nan", [{"at_step": 6, "rank": 1, "kind": "nan"}])
    assert summary["state"] == "SUCCEEDED" and summary["restarts"] == 0
    assert [d["step"] for k, d in rec.events if k == "skipped_step"] == [6]
    assert [s["step"] for s in rec.steps if s["skipped"]] == [6]
    assert summary["final_loss"] == pytest.approx(clean["final_loss"], rel=0.05)  # one batch fewer, same course
    assert summary["params_sha256"] != clean["params_sha256"]


def test_too_many_nan_steps_roll_back_to_the_last_checkpoint(clean, tmp_path):
    summary, rec = run(tmp_path, "rollback", [{"at_step": 7, "rank": 0, "kind": "nan"}],
                       **{"fault_tolerance.max_skipped_steps": 0, "fault_tolerance.skip_data_on_rollback": False})
    assert summary["state"] == "SUCCEEDED" and summary["restarts"] == 1
    [restart] = [d for k, d in rec.events if k == "restart"]
    assert restart["cause"] == "non_finite" and restart["resume_step"] == 5
    [rollback] = [d for k, d in rec.events if k == "rollback"]
    assert (rollback["from_step"], rollback["to_step"], rollback["data_window"]) == (7, 5, None)
    # The poisoned step was replayed from the checkpoint without the fault: bit-identical result.
    assert summary["params_sha256"] == clean["params_sha256"]


def test_a_flipped_bit_on_one_replica_is_caught_and_restored(clean, tmp_path):
    summary, rec = run(tmp_path, "bitflip", [{"at_step": 7, "rank": 1, "kind": "bitflip"}],
                       **{"fault_tolerance.integrity_check_every": 5})
    assert summary["state"] == "SUCCEEDED" and summary["restarts"] == 1
    [restart] = [d for k, d in rec.events if k == "restart"]
    # Rank 1's own checksums catch it before step 8's forward, naming it alone (comparing the two replicas
    # at step 10 could not say which one is wrong: workers/training/shard_integrity.py).
    assert restart["cause"] == "corruption" and "corrupted ranks: [1]" in restart["reason"], restart
    assert "step 8's forward" in restart["reason"], restart
    assert restart["resume_step"] == 5  # the corrupted state was never checkpointed
    assert summary["params_sha256"] == clean["params_sha256"]


def test_failure_causes_are_named():
    """From the exception's type, never its text (the ranks' own errors carry their cause)."""
    def raised_in_a_rank(exc):
        return ray.exceptions.RayTaskError("train", "traceback", exc)

    assert restart_cause(raised_in_a_rank(SilentDataCorruption("replicas disagree"))) == RestartCause.CORRUPTION
    assert restart_cause(raised_in_a_rank(NonFiniteTraining("3 bad steps"))) == RestartCause.NON_FINITE
    assert restart_cause(ray.exceptions.ActorDiedError()) == RestartCause.WORKER_LOST
    assert restart_cause(ray.exceptions.GetTimeoutError("get timed out")) == RestartCause.HANG
    assert restart_cause(raised_in_a_rank(RuntimeError("boom"))) == RestartCause.ERROR
    assert restart_cause(raised_in_a_rank(RuntimeError("boom")), RestartCause.START) == RestartCause.START
