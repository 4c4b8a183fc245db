"""Users' own models driven the way a user drives them: `trainyard run` and `trainyard validate`
on spec files. An HF Llama trained with FSDP exports hf/, which transformers loads and which
reproduces the final validation loss, and which a later job starts from; a user model that breaks
the loss convention fails at once (no restarts) with the shapes it returned."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from tests.api.test_cli_run import json_summary, trainyard, write_spec
from tests.user_models import LLAMA_SPEC

TRAIN = {"steps": 12, "global_batch_size": 16, "micro_batch_size": 4, "lr": 3e-3, "warmup_steps": 2,
         "eval_batches": 2}


def llama(**sections) -> dict:
    spec = copy.deepcopy(LLAMA_SPEC)
    spec.update({"train": dict(TRAIN), "resources": {"workers": 2}, "parallel": {"zero": 3}, **sections})
    return spec


def _validation_loss(model, spec_path: str) -> float:
    """The job's validation loss recomputed from the exported model: the same batches, the same rule."""
    from workers.data import build_datasets
    from workers.spec_loading import load_spec
    from workers.training.validation import eval_batches_of, validation_sums

    spec = load_spec(spec_path)
    train, val = build_datasets(spec)
    sums = [validation_sums(model, val, spec, r, spec.dp, max_batches=eval_batches_of(spec, train, val))
            for r in range(spec.dp)]
    return sum(t for t, _ in sums) / sum(c for _, c in sums)


@pytest.mark.slow
def test_hf_llama_exports_a_save_pretrained_directory_that_reproduces_its_loss(tmp_path, ray_address):
    from transformers import AutoModelForCausalLM

    path = write_spec(tmp_path, "llama-fsdp", llama(name="llama-fsdp"))
    summary = json_summary(trainyard(tmp_path, "run", path, "--json", ray_address=ray_address))
    assert summary["state"] == "SUCCEEDED" and summary["layout"]["strategy"] == "fsdp"
    hf_dir = Path(summary["hf_export_path"])
    assert hf_dir == Path(summary["job_dir"]) / "hf"
    assert (hf_dir / "config.json").is_file() and list(hf_dir.glob("*.safetensors"))
    assert (Path(summary["job_dir"]) / "model.safetensors").is_file()  # beside the plain export
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), local_files_only=True, dtype=torch.float32)
    assert _validation_loss(model, path) == pytest.approx(summary["final_val_loss"], rel=1e-5)

    # train.init_from takes the directory: the next job starts where this one ended.
    onward = llama(name="llama-onward", train={**TRAIN, "steps": 2, "init_from": str(hf_dir)})
    again = json_summary(trainyard(tmp_path, "run", write_spec(tmp_path, "onward", onward), "--json",
                                   ray_address=ray_address))
    assert again["state"] == "SUCCEEDED"
    assert again["initial_loss"] < summary["initial_loss"] - 0.5


@pytest.mark.slow
def test_a_model_breaking_the_loss_convention_fails_at_once_with_its_shapes(tmp_path, ray_address):
    spec = llama(name="classes-first", model={"entrypoint": "tests.fixtures.block_models:classes_first",
                                              "args": {"width": 32, "depth": 2}},
                 fault_tolerance={"max_restarts": 3}, parallel={})
    out = trainyard(tmp_path, "run", write_spec(tmp_path, "classes-first", spec), "--json", ray_address=ray_address)
    assert out.returncode != 0  # a failed job is a failed command
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["state"] == "FAILED" and summary["restarts"] == 0, summary
    for needle in ("class-last", "(4, 256, 16)", "(4, 16)", "not retryable"):
        assert needle in summary["error"], (needle, summary["error"])


def test_validate_refuses_tensor_parallelism_of_a_user_module_without_a_plan(tmp_path):
    spec = llama(name="no-plan", model={"entrypoint": "tests.fixtures.block_models:token_mlp"},
                 parallel={"tp": 2})
    out = trainyard(tmp_path, "validate", write_spec(tmp_path, "no-plan", spec))
    assert out.returncode != 0
    assert "model.tp_plan" in out.stderr + out.stdout
