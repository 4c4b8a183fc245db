"""Progress, not steps, on the session's real Ray: a validation longer than the hang timeout, a slow and then
a stalled checkpoint upload, a restart after the last step, and a rank out of memory (issue 46)."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.supervisor.run import JobRun
from tests.helpers import Events, spec_of

pytestmark = pytest.mark.slow

HANG_S = 3.0  # far below what the phases below take


def run(spec, job_dir: Path) -> tuple[dict, Events]:
    rec = Events()
    return JobRun(spec, job_dir, job_dir.name, listener=rec).run(), rec


def of(rec: Events, kind: str) -> list[dict]:
    return [data for k, data in rec.events if k == kind]


def test_a_final_validation_longer_than_the_hang_timeout_succeeds_and_a_restart_resumes_past_it(
        ray_cluster, tmp_path):
    # The job, smaller: FSDP, 4 steps, then the whole validation split (~12,500 windows of 16 tokens)
    # in evaluation batches, which takes several times the hang timeout on this host.
    spec = spec_of(model={"name": "gpt", "n_layers": 2, "d_model": 64, "n_heads": 4, "seq_len": 16},
                   data={"name": "text:pystdlib"},
                   **{"train.steps": 4, "train.global_batch_size": 16, "train.micro_batch_size": 2,
                      "train.eval_batches": "all", "parallel.dp": 2, "parallel.zero": 3, "resources.workers": 2,
                      "fault_tolerance.hang_timeout_s": HANG_S, "fault_tolerance.max_restarts": 0})
    summary, rec = run(spec, tmp_path / "fsdp")
    assert summary["state"] == "SUCCEEDED", summary["error"]
    assert summary["restarts"] == 0 and Path(summary["export_path"]).exists()
    covered = summary["final_validation"]
    assert covered["samples"] == covered["split_samples"] > 12_000 and covered["batch_size"] == 4  # the whole split
    [final] = of(rec, "validation")
    assert final["final"] and final["samples"] == covered["samples"]
    phases = [e for e in of(rec, "phase") if e["phase"] == "evaluating"]
    assert phases and phases[-1]["total"] == covered["batches"] and phases[-1]["elapsed_s"] > HANG_S / 2

    # A new attempt on the finished job's directory resumes after its last step: nothing is trained, the
    # final checkpoint, validation and export are not redone, and the result is the same.
    again, rec2 = run(spec, tmp_path / "fsdp")
    assert again["state"] == "SUCCEEDED" and again["restarts"] == 0
    assert again["params_sha256"] == summary["params_sha256"]
    assert again["final_val_loss"] == summary["final_val_loss"]
    assert of(rec2, "phase") == [] and again["steps"] == 0  # no step, no long phase: nothing redone


def test_a_slow_upload_progresses_and_a_stalled_one_is_restarted(ray_cluster, tmp_path):
    # The checkpoint at step 2 takes 6 s to write (the loop waits on it at step 4's checkpoint, past the
    # 3 s timeout): progress, no restart. The one at step 4 stops halfway: a hang, restarted once from
    # step 2's checkpoint, and then the job finishes.
    spec = spec_of(**{"train.steps": 6, "checkpoint.every_steps": 2, "resources.workers": 2,
                      "fault_tolerance.hang_timeout_s": HANG_S, "fault_tolerance.max_restarts": 1,
                      "fault_injection": [{"at_step": 2, "rank": 1, "kind": "slow_upload", "factor": 6},
                                          {"at_step": 4, "rank": 1, "kind": "stall_upload"}]})
    summary, rec = run(spec, tmp_path / "upload")
    assert summary["state"] == "SUCCEEDED", summary["error"]
    [restart] = of(rec, "restart")
    assert restart["cause"] == "hang" and restart["resume_step"] == 2, restart
    assert "while uploading checkpoint (step 4)" in restart["reason"], restart
    uploads = [e for e in of(rec, "phase") if e["phase"] == "uploading_checkpoint"]
    assert any(e["step"] == 2 and e["unit"] == "bytes" and 0 < e["done"] < e["total"] for e in uploads), uploads


def test_out_of_memory_in_a_rank_fails_the_job_at_once_with_the_figures(ray_cluster, tmp_path):
    spec = spec_of(**{"train.steps": 6, "resources.workers": 2, "fault_tolerance.max_restarts": 3,
                      "fault_injection": [{"at_step": 3, "rank": 1, "kind": "oom"}]})
    summary, rec = run(spec, tmp_path / "oom")
    assert summary["state"] == "FAILED" and summary["restarts"] == 0 and of(rec, "restart") == []
    error = summary["error"]
    assert "rank 1 ran out of memory in step 3" in error and "not retryable (out of memory)" in error, error
    assert "an allocation of 1,048,576.00 GiB" in error and "peak reached" in error, error
    assert "predicted peak per worker" in error, error


@pytest.mark.exhaustive  # two real runs (~1 min under load): make test-all
def test_a_crash_in_the_final_validation_resumes_into_it_without_training_again(ray_cluster, tmp_path):
    # Rank 1 dies halfway through the final validation, after step 4's checkpoint is durable: the restart
    # resumes from that checkpoint into the validation and the export, trains no step again, and ends
    # with the model a fault-free run ends with.
    base = {"train.steps": 4, "checkpoint.every_steps": 2, "resources.workers": 2, "train.eval_batches": 8,
            "fault_tolerance.max_restarts": 1}
    clean, _ = run(spec_of(**base), tmp_path / "clean")
    assert clean["state"] == "SUCCEEDED", clean["error"]
    crash = [{"at_step": 4, "rank": 1, "kind": "crash", "during": "final_validation"}]
    summary, rec = run(spec_of(**base, fault_injection=crash), tmp_path / "crashed")
    assert summary["state"] == "SUCCEEDED" and summary["restarts"] == 1, summary["error"]
    [restart] = of(rec, "restart")
    assert restart["resume_step"] == 4 and "rank 1" in restart["reason"], restart
    assert sorted(r["step"] for r in rec.steps) == [1, 2, 3, 4]  # no step trained twice
    [final] = [v for v in of(rec, "validation") if v["final"]]  # the crashed one was never recorded
    assert final["batches"] == 8 and summary["final_val_loss"] == clean["final_val_loss"]
    assert summary["params_sha256"] == clean["params_sha256"] and Path(summary["export_path"]).exists()
