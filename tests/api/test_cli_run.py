"""`trainyard run` driven the way a user drives it: a subprocess with a spec file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from api.cli.local import results_location
from tests.helpers import tiny_spec
from workers.storage import Storage

ROOT = Path(__file__).resolve().parents[2]
SUMMARY_KEYS = {"state", "steps", "initial_loss", "final_loss", "world_size", "layout", "samples_per_s",
                "bubble_fraction", "bubble_fraction_theoretical", "model_state_bytes_per_rank",
                "comm_bytes_per_step", "restarts", "params_sha256", "peak_memory_bytes_per_rank"}


def trainyard(tmp_path: Path, *args: str, allow_faults: bool = False,
              ray_address: str = "") -> subprocess.CompletedProcess:
    """The CLI as a user runs it. `ray_address`: join that cluster (the session's, which saves a Ray
    start per run), as a user with a cluster does; by default `run` starts a local Ray of its own."""
    env = {**os.environ, "TRAINYARD_HOME": str(tmp_path / "home"), "TRAINYARD_RAY_ADDRESS": ray_address}
    env.pop("TRAINYARD_ALLOW_FAULT_INJECTION", None)
    if allow_faults:
        env["TRAINYARD_ALLOW_FAULT_INJECTION"] = "1"
    return subprocess.run([sys.executable, "-m", "api.cli", *args], capture_output=True, text=True,
                          env=env, timeout=300, cwd=ROOT)


def write_spec(tmp_path: Path, name: str, data: dict) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def json_summary(out: subprocess.CompletedProcess) -> dict:
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_run_json_crash_recovers_to_the_fault_free_hash(tmp_path, ray_address):
    base = tiny_spec(**{"resources.workers": 2, "checkpoint.every_steps": 5, "train.steps": 16})
    clean = json_summary(trainyard(tmp_path, "run", write_spec(tmp_path, "clean", base), "--json",
                                   ray_address=ray_address))
    assert SUMMARY_KEYS <= clean.keys()
    assert clean["state"] == "SUCCEEDED" and clean["steps"] == 16 and clean["world_size"] == 2
    assert clean["final_loss"] < clean["initial_loss"]
    assert clean["layout"] == {"dp": 2, "tp": 1, "pp": 1, "cp": 1, "ep": 1, "zero": 0, "strategy": "ddp",
                               "world_size": 2}
    assert clean["bubble_fraction"] is None and clean["restarts"] == 0
    assert clean["comm_bytes_per_step"] > 0 and clean["model_state_bytes_per_rank"] > 0
    # Measured inside the steps: each rank's peak holds its model state and the step's activations.
    peaks = clean["peak_memory_bytes_per_rank"]
    assert len(peaks) == 2 and all(p > clean["model_state_bytes_per_rank"] for p in peaks), peaks

    crashing = dict(base, fault_injection=[{"at_step": 12, "rank": 1, "kind": "crash"}])
    faulty = json_summary(trainyard(tmp_path, "run", write_spec(tmp_path, "crash", crashing), "--json",
                                    allow_faults=True, ray_address=ray_address))
    assert faulty["state"] == "SUCCEEDED" and faulty["restarts"] == 1
    assert faulty["params_sha256"] == clean["params_sha256"]


def test_results_location_is_relative_to_the_current_directory_when_under_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert results_location(Storage.at(tmp_path / ".trainyard/storage/jobs/j1")) == "./.trainyard/storage/jobs/j1/"
    elsewhere = tmp_path.parent / "other/jobs/j1"
    assert results_location(Storage.at(elsewhere)) == f"{elsewhere}/"
    assert results_location(Storage.at("s3://bucket/prefix/jobs/j1")) == "s3://bucket/prefix/jobs/j1/"


@pytest.mark.slow
def test_run_shows_progress_and_summary(tmp_path):
    """The README's quick start, as it is written: `trainyard run examples/gpt-ddp.yaml`."""
    example = ROOT / "examples" / "gpt-ddp.yaml"
    steps = yaml.safe_load(example.read_text())["train"]["steps"]
    out = trainyard(tmp_path, "run", "examples/gpt-ddp.yaml")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "samples/s" in out.stdout and f"{steps}/{steps}" in out.stdout
    assert "params_sha256" in out.stdout and "SUCCEEDED" in out.stdout
    # The last line says where the job's files are: the README's quick start sends the user there.
    last = out.stdout.strip().splitlines()[-1]
    jobs = tmp_path / "home" / "storage" / "jobs"
    assert last.startswith(f"results: {jobs}/") and last.endswith("/"), last
    job_dir = Path(last.removeprefix("results: "))
    assert (job_dir / "model.safetensors").is_file() and (job_dir / "logs").is_dir()


def test_run_refuses_invalid_spec_with_the_field_named(tmp_path):
    out = trainyard(tmp_path, "run", write_spec(tmp_path, "bad", tiny_spec(**{"train.micro_batch_size": 5})))
    assert out.returncode == 2
    assert "train.global_batch_size must be divisible" in out.stderr


def test_run_refuses_fault_injection_unless_allowed(tmp_path):
    spec = tiny_spec(fault_injection=[{"at_step": 2, "kind": "crash"}])
    out = trainyard(tmp_path, "run", write_spec(tmp_path, "f", spec))
    assert out.returncode == 2 and "fault_injection is refused" in out.stderr


@pytest.mark.exhaustive  # make test: warm workers serve a job (tests/workers/test_pool.py), a restart (test_run_json_crash_recovers_to_the_fault_free_hash)
@pytest.mark.slow
def test_run_warm_workers_serve_the_restart(tmp_path, ray_address):
    spec = tiny_spec(**{"resources.workers": 2, "checkpoint.every_steps": 10, "train.steps": 80})
    spec["fault_injection"] = [{"at_step": 70, "rank": 0, "kind": "crash"}]
    summary = json_summary(trainyard(tmp_path, "run", write_spec(tmp_path, "warm", spec), "--json",
                                     "--warm-workers", "4", allow_faults=True, ray_address=ray_address))
    assert summary["state"] == "SUCCEEDED" and summary["restarts"] == 1
    # The pool had imported torch long before the crash: the restarted group is all warm workers.
    assert summary["warm_workers"] == 2


@pytest.mark.slow
def test_run_json_trains_a_moe_with_expert_parallelism(tmp_path, ray_address):
    """Expert parallelism the way a user reaches it: `trainyard run --json` on an MoE GPT whose experts are
    split over 2 of its 4 data-parallel ranks: it succeeds, learns, and its layout names ep (context
    parallelism the same way: tests/workers/test_strategies.py trains it through the supervisor's JobRun)."""
    spec = tiny_spec(**{"resources.workers": 4, "parallel.ep": 2, "train.steps": 6,
                        "model.n_heads": 4, "model.moe": {"experts": 4, "top_k": 2}})
    out = json_summary(trainyard(tmp_path, "run", write_spec(tmp_path, "axes", spec), "--json",
                                 ray_address=ray_address))
    assert out["state"] == "SUCCEEDED" and out["steps"] == 6, out
    assert {k: out["layout"][k] for k in ("dp", "cp", "ep", "strategy")} == {"dp": 4, "cp": 1, "ep": 2,
                                                                             "strategy": "ddp"}
    assert out["final_loss"] < out["initial_loss"]
