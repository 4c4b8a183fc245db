"""Users' own models under the parallel strategies, on a real Ray with gloo: HF Llama (GQA), HF GPT-2
and a plain nn.Module with a ModuleList of blocks, each against its single-process reference on the
same seed and global batch (fp32: loss within 1e-4 relative after 10 and 20 steps).

`make test` trains a representative subset; the whole matrix is marked `exhaustive` (make test-all).
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest

from tests.helpers import TrainedOnce, alive_actors, train
from tests.user_models import GPT2_SPEC, LLAMA_SPEC, TOKEN_MLP_SPEC
from workers.spec_loading import parse_spec

pytestmark = pytest.mark.slow

# Hugging Face style dict samples {input_ids, labels, attention_mask}, trained on the model's own loss.
LLAMA_DICT_SPEC = {**LLAMA_SPEC, "data": {"entrypoint": "tests.fixtures.block_models:causal_tokens",
                                          "args": {"seq_len": 16}}, "train": {"loss": "model"}}
MODELS = {"llama": LLAMA_SPEC, "gpt2": GPT2_SPEC, "token_mlp": TOKEN_MLP_SPEC, "llama_dict": LLAMA_DICT_SPEC}
TRAIN = {"steps": 20, "global_batch_size": 16, "micro_batch_size": 4, "lr": 3e-3, "warmup_steps": 2}

LAYOUTS = {
    "reference": {"resources.workers": 1},
    "dp2": {"resources.workers": 2},
    "zero1": {"resources.workers": 2, "parallel.zero": 1},
    "zero2": {"resources.workers": 2, "parallel.zero": 2},
    "fsdp2": {"resources.workers": 2, "parallel.zero": 3},
    "fsdp4": {"resources.workers": 4, "parallel.zero": 3},
    "hsdp": {"resources.workers": 4, "parallel.zero": 3, "parallel.dp_shard": 2},
    "tp2": {"resources.workers": 2, "parallel.tp": 2},
    "tp2_sp": {"resources.workers": 2, "parallel.tp": 2, "parallel.sequence_parallel": True},
    "dp2xtp2": {"resources.workers": 4, "parallel.tp": 2},
    "fsdp2xtp2": {"resources.workers": 4, "parallel.tp": 2, "parallel.zero": 3},
    "dp2_ac": {"resources.workers": 2, "parallel.activation_checkpointing": True},
    "fsdp2_ac": {"resources.workers": 2, "parallel.zero": 3, "parallel.activation_checkpointing": True},
    # context parallelism: attention through transformers' attention interface around the cp ring
    "cp2": {"resources.workers": 2, "parallel.cp": 2},
    "fsdp2xcp2": {"resources.workers": 4, "parallel.zero": 3, "parallel.cp": 2},
    "tp2xcp2": {"resources.workers": 4, "parallel.tp": 2, "parallel.cp": 2},
    # pipeline stages each running the ring over their cp pair (rotary positions global on every stage)
    "pp2xcp2": {"resources.workers": 4, "parallel.pp": 2, "parallel.cp": 2},
}
STRATEGY = {"dp2": "ddp", "zero1": "zero", "zero2": "zero", "fsdp2": "fsdp", "fsdp4": "fsdp", "hsdp": "fsdp",
            "tp2": "tp", "tp2_sp": "tp", "dp2xtp2": "tp", "fsdp2xtp2": "fsdp", "dp2_ac": "ddp", "fsdp2_ac": "fsdp",
            "cp2": "ddp", "fsdp2xcp2": "fsdp", "tp2xcp2": "tp", "pp2xcp2": "pipeline"}
# What `make test` trains; the rest of each model's row is exhaustive.
REPRESENTATIVE = {
    "llama": {"dp2", "tp2_sp", "fsdp2_ac", "cp2"},  # 2-D: pp x tp x dp in test_pipeline_models
    "gpt2": set(),  # GPT-2 under pp 2 in test_pipeline_models
    "token_mlp": {"tp2"},
    "llama_dict": {"fsdp2"},
}
MATRIX = {
    "llama": [n for n in LAYOUTS if n != "reference"],
    "gpt2": ["dp2", "fsdp2", "zero1", "dp2_ac"],  # no tp: transformers ships no plan for GPT-2
    "token_mlp": ["dp2", "fsdp2", "tp2", "dp2_ac"],
    "llama_dict": ["dp2", "fsdp2", "tp2"],
}


def spec_for(model: str, layout: str, **extra):
    data = copy.deepcopy(MODELS[model])
    data["name"] = f"{model}-{layout}".replace("_", "-")
    data["train"] = {**TRAIN, **data.get("train", {})}
    data["checkpoint"] = {"every_steps": 10}
    for key, value in {**LAYOUTS[layout], **extra}.items():
        node = data
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return parse_spec(data, allow_fault_injection=True)


@pytest.fixture(scope="module")
def runs(ray_cluster, tmp_path_factory):
    yield TrainedOnce(tmp_path_factory.mktemp("user-models"), spec_for)
    assert alive_actors() == []


def _cases():
    for model, layouts in MATRIX.items():
        for layout in layouts:
            marks = () if layout in REPRESENTATIVE[model] else (pytest.mark.exhaustive,)
            yield pytest.param(model, layout, id=f"{model}-{layout}", marks=marks)


@pytest.mark.parametrize(("model", "layout"), list(_cases()))
def test_loss_matches_single_process_reference(runs, model, layout):
    _, ref = runs[model, "reference"]
    summary, steps = runs[model, layout]
    assert summary["layout"]["strategy"] == STRATEGY[layout]
    assert ref[-1]["loss"] < ref[0]["loss"] - 0.5  # the reference learns
    for step in (9, 19):
        assert steps[step]["loss"] == pytest.approx(ref[step]["loss"], rel=1e-4), (model, layout, step)


@pytest.mark.exhaustive  # make test: the built-in GPT's checkpoints across layouts (test_strategies)
def test_fsdp_checkpoint_resumes_under_tensor_parallel(runs, tmp_path):
    """Llama's step-10 checkpoint written under FSDP on 4 resumes under tp2 x dp1: steps 11..20 continue."""
    summary, steps = runs["llama", "fsdp4"]
    src = Path(summary["job_dir"]) / "checkpoints" / "step-00000010"
    job = tmp_path / "fsdp4-to-tp2"
    shutil.copytree(src, job / "checkpoints" / "step-00000010")
    _, resumed = train(spec_for("llama", "tp2"), job)
    assert [s["step"] for s in resumed] == list(range(11, 21))
    for s in resumed:
        assert s["loss"] == pytest.approx(steps[s["step"] - 1]["loss"], rel=1e-4), s["step"]


@pytest.mark.exhaustive  # make test: crash restarts of the built-in GPT (test_cli_run) and of programs (test_programs)
def test_crash_restart_of_an_hf_model_ends_with_the_fault_free_hash(runs, tmp_path):
    """Llama under FSDP on 4, rank 2 crashing at step 13: resumed from the step-10 checkpoint, it ends
    bit-identical to the fault-free run."""
    clean, _ = runs["llama", "fsdp4"]
    spec = spec_for("llama", "fsdp4", fault_injection=[{"at_step": 13, "rank": 2, "kind": "crash"}])
    summary, _ = train(spec, tmp_path / "crash")
    assert summary["restarts"] == 1
    assert summary["params_sha256"] == clean["params_sha256"]


def test_mixed_precision_on_an_hf_model(runs, tmp_path):
    """bf16 autocast with fp32 master weights, as for the built-in GPT: within bf16's bound of fp32."""
    _, ref = runs["llama", "reference"]
    _, steps = train(spec_for("llama", "fsdp2", **{"parallel.mixed_precision": "bf16"}), tmp_path / "bf16")
    assert steps[19]["loss"] == pytest.approx(ref[19]["loss"], rel=1e-2)


@pytest.mark.timeout(1800)  # trains the layouts it needs when run on its own
def test_planner_predicts_the_measured_model_state_of_an_hf_model(runs):
    """The planner counts Llama's real parameters (and the ones its TP plan shards): its predicted
    model-state bytes per rank match the measured ones within 10% for every representative layout."""
    from workers.parallel.planner import estimate

    for layout in sorted(REPRESENTATIVE["llama"]):
        summary, _ = runs["llama", layout]
        predicted = estimate(spec_for("llama", layout))
        assert predicted.strategy == summary["layout"]["strategy"], layout
        assert predicted.model_state_bytes_per_rank == pytest.approx(summary["model_state_bytes_per_rank"],
                                                                     rel=0.10), layout
