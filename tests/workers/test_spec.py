"""Every JobSpec rule, with the message it gives."""

import json
import subprocess
import sys

import pytest

from tests.helpers import tiny_spec
from workers.spec import SPEC_ERRORS, JobSpec, format_validation_error
from workers.spec_loading import parse_spec

ARCHITECTURE_EXAMPLE = {
    "name": "gpt-ddp",
    "model": {"name": "gpt", "n_layers": 4, "d_model": 128, "n_heads": 4, "seq_len": 64},
    "data": {"name": "text:pystdlib"},
    "train": {"steps": 200, "global_batch_size": 32, "micro_batch_size": 8, "lr": 3.0e-3,
              "warmup_steps": 20, "seed": 0, "loss": "cross_entropy"},
    "parallel": {"dp": 2, "tp": 1, "pp": 1, "zero": 0},
    "resources": {"workers": 2, "cpus_per_worker": 1},
    "checkpoint": {"every_steps": 50, "keep": 2},
    "fault_tolerance": {"max_restarts": 3},
}


def test_architecture_example_is_valid():
    spec = parse_spec(ARCHITECTURE_EXAMPLE)
    assert (spec.dp, spec.world_size, spec.grad_accum_steps) == (2, 2, 2)


def test_dp_defaults_to_workers():
    assert parse_spec(tiny_spec(**{"resources.workers": 4})).dp == 4


INVALID = [
    # (overrides, field, words that the message must contain)
    ({"name": "Bad Name"}, "name", ["pattern"]),
    ({"bogus": 1}, "bogus", ["is not a top-level key of the spec"]),
    ({"train.bogus": 1}, "train.bogus", ["is not a key of train"]),
    ({"train.micro_batchsize": 2}, "train.micro_batchsize", ["did you mean train.micro_batch_size?"]),
    ({"model.d_model": 30, "model.n_heads": 4}, "model.d_model", ["divisible by model.n_heads", "d_model=30", "n_heads=4"]),
    ({"model.name": "resnet"}, "model.name", ["'gpt', 'mlp' or 'dlrm'", "entrypoint"]),
    ({"model": {"entrypoint": "not a path"}}, "model.entrypoint", ["pattern"]),
    ({"data.name": "imagenet"}, "data.name", ["'text:pystdlib', 'synthetic' or 'synthetic:clicks'"]),
    ({"train.steps": 0}, "train.steps", ["greater than or equal to 1"]),
    ({"train.lr": -1}, "train.lr", ["greater than 0"]),
    ({"train.loss": "hinge"}, "train.loss", ["cross_entropy", "mse"]),
    ({"parallel.dp": 3, "resources.workers": 2}, "parallel", ["dp=3", "workers=2", "must equal resources.workers"]),
    ({"parallel.tp": 4, "resources.workers": 4, "parallel.dp": 1}, "parallel.tp",
     ["must divide model.n_heads", "tp=4", "n_heads=2", "d_model=32"]),
    ({"parallel.tp": 2, "resources.workers": 2, "parallel.zero": 2}, "parallel.zero", ["use zero 3", "zero=2", "tp=2"]),
    ({"parallel.sequence_parallel": True}, "parallel.sequence_parallel", ["tp > 1", "tp=1"]),
    ({"parallel.dp_shard": 2, "resources.workers": 4}, "parallel.dp_shard", ["zero 3", "zero=0", "dp_shard=2"]),
    ({"parallel.dp_shard": 3, "parallel.zero": 3, "resources.workers": 4}, "parallel.dp_shard",
     ["must divide parallel.dp", "dp=4", "dp_shard=3"]),
    ({"parallel.compression": {"kind": "bf16"}, "resources.workers": 2}, "parallel.compression.kind",
     ["needs GPU workers", "gloo", "'fp16' or 'powersgd'"]),
    ({"parallel.compression": {"kind": "fp16"}, "parallel.zero": 3}, "parallel.compression",
     ["plain data parallelism", "zero=3"]),
    ({"parallel.compression": {"kind": "twobit"}}, "parallel.compression.kind", ["'onebit'", "'signsgd'"]),
    ({"parallel.compression": {"kind": "onebit", "error_feedback": "sometimes"}},
     "parallel.compression.error_feedback", ["boolean"]),
    ({"parallel.compression": {"kind": "fp16", "error_feedback": False}}, "parallel.compression.error_feedback",
     ["kind 'onebit' or 'signsgd'", "kind='fp16'"]),
    ({"parallel.compression": {"kind": "onebit"}, "parallel.zero": 3}, "parallel.compression",
     ["plain data parallelism", "zero=3"]),
    ({"parallel.compression": {"kind": "signsgd"}, "parallel.tp": 2, "resources.workers": 2}, "parallel.compression",
     ["plain data parallelism", "tp=2"]),
    ({"parallel.compression": {"kind": "signsgd"}, "parallel.local_sgd": {"period": 2}}, "parallel.compression",
     ["exclude each other"]),
    ({"parallel.local_sgd": {"period": 0}}, "parallel.local_sgd.period", ["greater than or equal to 1"]),
    ({"parallel.mixed_precision": "fp16", "parallel.pp": 2, "resources.workers": 2}, "parallel.mixed_precision",
     ["must be 'fp32' with pipeline", "mixed_precision='fp16'", "pp=2"]),
    ({"parallel.offload_optimizer": True}, "parallel.offload_optimizer", ["zero 1 or 2", "zero=0"]),
    ({"parallel.pp": 2, "resources.workers": 2, "model": {"name": "mlp"}, "data": {"name": "synthetic"},
      "train.loss": "mse"}, "parallel.pp", ["repeated blocks", "pp=2"]),
    ({"parallel.pp": 2, "resources.workers": 2, "model.n_layers": 4,
      "parallel.pipeline": {"schedule": "interleaved_1f1b", "microbatches": 1}},
     "parallel.pipeline.microbatches", ["multiple of parallel.pp", "microbatches=1", "pp=2"]),
    ({"parallel.pp": 2, "resources.workers": 2, "parallel.pipeline": {"microbatches": 3}},
     "parallel.pipeline.microbatches", ["must divide", "microbatches=3", "per step=4"]),
    ({"parallel.pp": 2, "resources.workers": 2, "parallel.pipeline": {"schedule": "dualpipe_v", "virtual_stages": 3}},
     "parallel.pipeline.virtual_stages", ["must be 2", "virtual_stages=3"]),
    ({"parallel.pp": 2, "resources.workers": 2, "model.n_layers": 4, "parallel.pipeline": {"split": [4, 1]}},
     "parallel.pipeline.split", ["summing to model.n_layers", "split=[4, 1]", "n_layers=4"]),
    ({"parallel.pipeline": {"schedule": "gpipe"}}, "parallel.pipeline", ["pp > 1", "pp=1"]),
    ({"parallel.pp": 2, "resources.workers": 2, "parallel.pipeline": {"schedule": "hanayo"}},
     "parallel.pipeline.schedule", ["gpipe", "zbv_zero_bubble", "chimera"]),
    ({"parallel.pp": 3, "resources.workers": 3, "model.n_layers": 4, "train.global_batch_size": 12,
      "parallel.pipeline": {"schedule": "chimera"}}, "parallel.pp", ["must be even", "'chimera'", "pp=3"]),
    ({"parallel.pp": 2, "resources.workers": 2, "train.global_batch_size": 6,
      "parallel.pipeline": {"schedule": "chimera", "microbatches": 3}},
     "parallel.pipeline.microbatches", ["must be even", "microbatches=3"]),
    ({"parallel.pp": 2, "resources.workers": 4, "parallel.tp": 2, "parallel.pipeline": {"schedule": "chimera"}},
     "parallel.tp", ["must be 1 with schedule 'chimera'", "tp=2"]),
    ({"parallel.pp": 2, "resources.workers": 2, "train.global_batch_size": 16,
      "parallel.pipeline": {"schedule": "pipedream_2bw", "microbatches": 2}},
     "parallel.pipeline.microbatches", ["must be the step's micro-batches", "no flush", "microbatches=2",
                                        "per step=4"]),
    ({"parallel.pp": 4, "resources.workers": 4, "model.n_layers": 4, "train.global_batch_size": 4,
      "parallel.pipeline": {"schedule": "pipedream"}},
     "train.global_batch_size", ["at least parallel.pp micro-batches", "per step=1", "pp=4"]),
    ({"parallel.pp": 2, "resources.workers": 4, "resources.min_workers": 2,
      "parallel.pipeline": {"schedule": "pipedream_2bw"}},
     "resources.min_workers", ["must equal resources.workers", "'pipedream_2bw'", "min_workers=2"]),
    ({"parallel.pp": 2, "resources.workers": 4, "parallel.tp": 2, "parallel.sequence_parallel": True},
     "parallel.sequence_parallel", ["not available with pipeline parallelism", "pp=2"]),
    ({"parallel.pp": 2, "resources.workers": 2, "parallel.pipeline": {"rebalance_threshold": 0.2}},
     "parallel.pipeline.rebalance_threshold", ["checkpoint.every_steps > 0", "every_steps=0"]),
    # one error each, whole: a rule's message may hold "; " (it once split into bogus fields here)
    ({"parallel.pp": 2, "resources.workers": 2, "supervisor.straggler.policy": "rebalance"},
     "supervisor.straggler.policy", ["needs a data-parallel step that takes uneven shares", "pp=2",
                                     "rebalance_threshold balances the stages"]),
    ({"parallel.tp": 2, "resources.workers": 2, "supervisor.straggler.policy": "rebalance"},
     "supervisor.straggler.policy", ["must see the same samples", "use 'report' or 'replace'", "tp=2"]),
    ({"parallel.local_sgd": {"period": 4}, "supervisor.straggler.policy": "rebalance"},
     "supervisor.straggler.policy", ["parallel.local_sgd averages the parameters", "not gradients weighted"]),
    ({"parallel.zero": 3, "resources.workers": 2, "supervisor.straggler.policy": "rebalance"},
     "supervisor.straggler.policy", ["parallel.zero 3 (FSDP)", "all-gathers parameters", "zero=3"]),
    ({"parallel.zero": 2, "resources.workers": 2, "supervisor.straggler.policy": "rebalance"},
     "supervisor.straggler.policy", ["parallel.zero 2", "every micro-batch", "zero=2"]),
    # every checkpoint must land on a checked step (layouts without replicas are checked too: test_shard_integrity)
    ({"resources.workers": 2, "fault_tolerance.integrity_check_every": 4, "checkpoint.every_steps": 6},
     "checkpoint.every_steps", ["multiple of fault_tolerance.integrity_check_every", "every_steps=6",
                                "integrity_check_every=4"]),
    ({"resources.workers": 2, "parallel.local_sgd": {"period": 4}, "fault_tolerance.integrity_check_every": 6},
     "fault_tolerance.integrity_check_every", ["multiple of parallel.local_sgd.period", "period=4"]),
    ({"parallel.zero": 4}, "parallel.zero", ["less than or equal to 3"]),
    ({"train.global_batch_size": 20, "resources.workers": 2}, "train.global_batch_size",
     ["divisible by parallel.dp x train.micro_batch_size", "global_batch_size=20", "dp=2", "micro_batch_size=4"]),
    ({"train.warmup_steps": 50}, "train.warmup_steps", ["must not exceed train.steps", "warmup_steps=50", "steps=20"]),
    ({"resources.workers": 0}, "resources.workers", ["greater than or equal to 1"]),
    ({"resources.cpus_per_worker": 0}, "resources.cpus_per_worker", ["greater than 0"]),
    ({"checkpoint.keep": 0}, "checkpoint.keep", ["greater than or equal to 1"]),
    ({"fault_tolerance.max_restarts": -1}, "fault_tolerance.max_restarts", ["greater than or equal to 0"]),
    ({"fault_tolerance.max_infra_restarts": -1}, "fault_tolerance.max_infra_restarts", ["greater than or equal to 0"]),
    ({"data": {"name": "synthetic"}}, "data.name", ["'gpt' needs token data"]),
    ({"model": {"name": "mlp"}}, "data.name", ["'mlp' needs vector data"]),
    ({"model": {"name": "mlp", "in_features": 8}, "data": {"name": "synthetic", "in_features": 16}, "train.loss": "mse"},
     "model.in_features/out_features", ["model 8->1", "data 16->1"]),
    ({"model": {"name": "mlp"}, "data": {"name": "synthetic"}}, "train.loss", ["'mse'"]),
    ({"model.vocab_size": 100}, "model.vocab_size", [">= 256"]),
    ({"resources.gpus_per_worker": 2}, "resources.gpus_per_worker",
     ["at most 1 for Trainyard's own loop", "one rank per GPU", "machines x 2", "gpus_per_worker=2"]),
    ({"resources.gpus_per_worker": 1.5}, "resources.gpus_per_worker", ["whole number", "gpus_per_worker=1.5"]),
]


@pytest.mark.parametrize("overrides,field,words", INVALID, ids=[f"{i}-{c[1]}" for i, c in enumerate(INVALID)])
def test_invalid_specs_name_field_and_rule(overrides, field, words):
    with pytest.raises(SPEC_ERRORS) as info:
        parse_spec(tiny_spec(**overrides), allow_fault_injection=False)
    errors = format_validation_error(info.value)
    matching = [e for e in errors if e["field"] == field]
    assert matching, f"no error for {field}: {errors}"
    assert all(e["message"].startswith(e["field"]) for e in errors), errors  # no fragment posing as a field
    for word in words:
        assert any(word in e["message"] for e in matching), f"{word!r} not in {matching}"


def test_fault_injection_refused_unless_allowed(monkeypatch):
    spec = tiny_spec(fault_injection=[{"at_step": 3, "rank": 0, "kind": "crash"}])
    monkeypatch.delenv("TRAINYARD_ALLOW_FAULT_INJECTION", raising=False)
    with pytest.raises(SPEC_ERRORS, match="fault_injection is refused"):
        parse_spec(spec)
    monkeypatch.setenv("TRAINYARD_ALLOW_FAULT_INJECTION", "1")
    assert parse_spec(spec).fault_injection[0].kind == "crash"


@pytest.mark.parametrize("fault,field,word", [
    ({"at_step": 99, "rank": 0, "kind": "crash"}, "fault_injection[0].at_step", "steps=20"),
    ({"at_step": 2, "rank": 5, "kind": "hang"}, "fault_injection[0].rank", "workers=1"),
    ({"at_step": 20, "kind": "hang", "during": "final_validation"}, "fault_injection[0].during", "kind 'crash'"),
    ({"at_step": 19, "kind": "crash", "during": "final_validation"}, "fault_injection[0].during", "train.steps=20"),
])
def test_fault_injection_bounds(fault, field, word):
    with pytest.raises(SPEC_ERRORS) as info:
        parse_spec(tiny_spec(fault_injection=[fault]), allow_fault_injection=True)
    errors = format_validation_error(info.value)
    assert any(e["field"] == field and word in e["message"] for e in errors), errors


def test_all_errors_are_reported_together():
    with pytest.raises(SPEC_ERRORS) as info:
        parse_spec(tiny_spec(**{"parallel.zero": 1, "parallel.tp": 2, "resources.workers": 2,
                                "train.warmup_steps": 99}))
    fields = {e["field"] for e in format_validation_error(info.value)}
    assert {"parallel.zero", "train.warmup_steps"} <= fields


def test_json_schema_is_exported_by_cli():
    out = subprocess.run([sys.executable, "-m", "api.cli", "schema"], capture_output=True, text=True, check=True)
    schema = json.loads(out.stdout)
    assert schema["title"] == "JobSpec" and "parallel" in schema["properties"]
    assert JobSpec.model_json_schema() == schema


def test_cli_validate_reports_field_and_exit_code(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nresources: {workers: 2}\nparallel: {dp: 3}\n")
    out = subprocess.run([sys.executable, "-m", "api.cli", "validate", str(bad)], capture_output=True, text=True)
    assert out.returncode == 2
    assert "dp=3" in out.stderr and "workers=2" in out.stderr


def test_examples_are_valid():
    from pathlib import Path

    from workers.spec_loading import load_spec

    examples = sorted(Path(__file__).resolve().parents[2].joinpath("examples").glob("*.yaml"))
    assert examples
    for path in examples:
        load_spec(path)
