"""Pipeline parallelism for models other than the built-in GPT, on a real local Ray with gloo: every
step's loss against the single-process reference of the same model, seed and global batch.

TRAINYARD_ALL_SCHEDULES=1 adds the other five schedules for Llama (slow on two cores)."""

from __future__ import annotations

import os

import pytest

from service.supervisor.run import JobRun
from tests.helpers import Events
from tests.workers.test_pipeline_stage import GPT2, LLAMA, USER
from workers.spec import parse_spec

pytestmark = pytest.mark.slow

REL = 1e-4
STEPS = 10


def spec_for(model: dict, pp: int = 1, schedule: str | None = None):
    return parse_spec({
        "name": "pp-models", "model": model,
        "data": {"name": "text:pystdlib", "max_bytes": 200_000, "seq_len": 32},
        "train": {"steps": STEPS, "global_batch_size": 16, "micro_batch_size": 4, "lr": 3e-3, "warmup_steps": 2},
        "resources": {"workers": pp},
        "parallel": {"pp": pp, **({"pipeline": {"schedule": schedule}} if schedule else {})},
    }, allow_fault_injection=True)


def run(spec, tmp_path, name):
    rec = Events()
    summary = JobRun(spec, tmp_path / name, name, listener=rec).run()
    assert summary["state"] == "SUCCEEDED", summary["error"]
    return summary, [s["loss"] for s in rec.steps]


_references: dict[str, list[float]] = {}


def reference(name, model, tmp_path_factory):
    if name not in _references:
        _, losses = run(spec_for(model), tmp_path_factory.mktemp(f"ref-{name}"), "ref")
        _references[name] = losses
    return _references[name]


ALL = os.environ.get("TRAINYARD_ALL_SCHEDULES") == "1"
LLAMA_SCHEDULES = ["gpipe", "1f1b"] + (["interleaved_1f1b", "looped_bfs", "zero_bubble", "zbv_zero_bubble",
                                        "dualpipe_v"] if ALL else [])
CASES = [("llama", LLAMA, s) for s in LLAMA_SCHEDULES] + [("gpt2", GPT2, "1f1b"), ("user", USER, "1f1b")]


@pytest.mark.parametrize("name,model,schedule", CASES, ids=[f"{n}-{s}" for n, _, s in CASES])
def test_pp2_matches_single_process_reference(ray_cluster, tmp_path, tmp_path_factory, name, model, schedule):
    expected = reference(name, model, tmp_path_factory)
    summary, losses = run(spec_for(model, pp=2, schedule=schedule), tmp_path, f"{name}-{schedule}")
    assert len(losses) == STEPS and losses[-1] < losses[0]  # it trains
    assert losses == pytest.approx(expected, rel=REL)
    assert summary["layout"]["strategy"] == "pipeline" and summary["layout"]["pp"] == 2
    split = summary["pipeline"]["split"]
    assert split[0]["embedding"] and not split[0]["head"] and split[-1]["head"] and not split[-1]["embedding"]
    assert summary["comm_bytes_per_step"] > 0
