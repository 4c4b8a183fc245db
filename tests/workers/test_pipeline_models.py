"""Pipeline parallelism for models other than the built-in GPT, on a real local Ray with gloo: every
step's loss against the single-process reference of the same model, seed and global batch.

`make test` runs Llama with gpipe and 1f1b, the seeds' 3D layout (pp 2 x tp 2 x dp 2 on 8 workers), GPT-2
and a plain ModuleList module; the other five schedules and the 2-D layouts are `exhaustive` (make test-all)."""

from __future__ import annotations

import pytest

from service.supervisor.run import JobRun
from tests.helpers import Events
from tests.workers.test_pipeline_stage import GPT2, LLAMA, USER
from workers.spec_loading import parse_spec

pytestmark = pytest.mark.slow

REL = 1e-4
STEPS = 10


def spec_for(model: dict, pp: int = 1, schedule: str | None = None, tp: int = 1, dp: int = 1):
    return parse_spec({
        "name": "pp-models", "model": model,
        "data": {"name": "text:pystdlib", "max_bytes": 200_000, "seq_len": 32},
        "train": {"steps": STEPS, "global_batch_size": 16, "micro_batch_size": 4, "lr": 3e-3, "warmup_steps": 2},
        "resources": {"workers": pp * tp * dp},
        "parallel": {"pp": pp, "tp": tp, "dp": dp, **({"pipeline": {"schedule": schedule}} if schedule else {})},
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


EXHAUSTIVE = (pytest.mark.exhaustive,)
# (name, model, schedule, tp, dp, marks)
CASES = [("llama", LLAMA, "gpipe", 1, 1, EXHAUSTIVE),  # gpipe: pp 4 on the built-in GPT (test_pipeline)
          ("llama", LLAMA, "1f1b", 1, 1, EXHAUSTIVE)]  # 1f1b: in the 3D case
CASES += [("llama", LLAMA, s, 1, 1, EXHAUSTIVE) for s in ("interleaved_1f1b", "looped_bfs", "zero_bubble",
                                                          "zbv_zero_bubble", "dualpipe_v")]
CASES += [("llama", LLAMA, "1f1b", 1, 2, EXHAUSTIVE), ("llama", LLAMA, "1f1b", 2, 1, EXHAUSTIVE),
          ("llama", LLAMA, "1f1b", 2, 2, ()),  # 3D: pp 2 x tp 2 x dp 2 on 8 workers
          ("gpt2", GPT2, "1f1b", 1, 1, ()), ("user", USER, "1f1b", 1, 1, ())]


@pytest.mark.parametrize("name,model,schedule,tp,dp", [pytest.param(*c[:5], marks=c[5], id=f"{c[0]}-{c[2]}-pp2-tp{c[3]}-dp{c[4]}")
                                                   for c in CASES])
def test_pp2_matches_single_process_reference(ray_cluster, tmp_path, tmp_path_factory, name, model, schedule, tp, dp):
    expected = reference(name, model, tmp_path_factory)
    summary, losses = run(spec_for(model, pp=2, schedule=schedule, tp=tp, dp=dp), tmp_path, f"{name}-{schedule}")
    assert len(losses) == STEPS and losses[-1] < losses[0]  # it trains
    assert losses == pytest.approx(expected, rel=REL)
    assert summary["layout"] == {"dp": dp, "tp": tp, "pp": 2, "cp": 1, "ep": 1, "zero": 0, "strategy": "pipeline",
                                 "world_size": 2 * tp * dp}
    split = summary["pipeline"]["split"]
    assert split[0]["embedding"] and not split[0]["head"] and split[-1]["head"] and not split[-1]["embedding"]
    assert summary["comm_bytes_per_step"] > 0
    assert summary["bubble_fraction"] is not None and summary["bubble_fraction_theoretical"] is not None
