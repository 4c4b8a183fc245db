"""Spec errors in the spec's words (issue 52): each names the dotted field as written, repeats the value
given, answers an unknown key with the closest valid one, and a spec's field errors come with the
cross-field rules its other fields break, but not with complaints that a default standing in for a
refused value would cause."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tests.helpers import tiny_spec
from workers.spec import SPEC_ERRORS, JobSpec, format_validation_error
from workers.spec_loading import parse_spec


def messages(data: dict) -> list[str]:
    with pytest.raises(SPEC_ERRORS) as info:
        parse_spec(data, allow_fault_injection=True)
    return [e["message"] for e in format_validation_error(info.value)]


@pytest.mark.parametrize("overrides, message", [
    ({"train.micro_batchsize": 4},
     "train.micro_batchsize: is not a key of train; did you mean train.micro_batch_size?"),
    ({"model.n_layer": 2}, "model.n_layer: is not a key of model; did you mean model.n_layers?"),
    ({"parallel.pipeline": {"shedule": "gpipe"}},
     "parallel.pipeline.shedule: is not a key of parallel.pipeline; did you mean parallel.pipeline.schedule?"),
    ({"trian": {}}, "trian: is not a top-level key of the spec; did you mean train?"),
    ({"train.lr": -1}, "train.lr: must be greater than 0 (got -1)"),
    ({"train.steps": "many"}, "train.steps: must be a valid integer (got 'many')"),
    ({"train.loss": "hinge"}, "train.loss: must be 'cross_entropy', 'mse', 'bce' or 'model' (got 'hinge')"),
    ({"parallel.offload_optimizer": "maybe"}, "parallel.offload_optimizer: must be a valid boolean (got 'maybe')"),
    ({"train": 3}, "train: must be a mapping of keys (got 3)"),
    ({"parallel": "automatic"}, "parallel: must be a mapping of keys or 'auto' (got 'automatic')"),
    ({"model.name": "gpt2"}, "model.name must be 'gpt', 'mlp' or 'dlrm', or give model.hf or model.entrypoint (got 'gpt2')"),
    ({"data.name": "imagenet"},
     "data.name must be 'text:pystdlib', 'synthetic' or 'synthetic:clicks', or give data.files or data.entrypoint (got 'imagenet')"),
])
def test_a_field_error_names_the_field_and_repeats_the_value(overrides, message):
    assert messages(tiny_spec(**overrides)) == [message]


def test_a_list_item_is_named_as_the_rules_name_it():
    spec = tiny_spec(fault_injection=[{"at_step": 0, "kind": "crash", "rnk": 1}])
    assert messages(spec) == ["fault_injection[0].at_step: must be greater than or equal to 1 (got 0)",
                              "fault_injection[0].rnk: is not a key of fault_injection[0]; "
                              "did you mean fault_injection[0].rank?"]


def test_no_class_name_leaks():
    for data in (tiny_spec(train=3), tiny_spec(parallel=[1]), tiny_spec(**{"model.name": 7})):
        for message in messages(data):
            assert "Spec" not in message and "instance of" not in message, message


def test_field_and_cross_field_errors_come_together():
    both = tiny_spec(**{"train.lr": -1, "parallel.dp": 3, "resources.workers": 2, "checkpoint.keep": 0,
                        "supervisor.straggler": {"threshold": 0.9, "recover": 0.5}})
    assert messages(both) == [
        "train.lr: must be greater than 0 (got -1)",
        "checkpoint.keep: must be greater than or equal to 1 (got 0)",
        "parallel: dp x tp x pp must equal resources.workers (dp=3 x tp=1 x pp=1 = 3, workers=2)",
        "supervisor.straggler.recover must exceed supervisor.straggler.threshold (recover=0.5, threshold=0.9)"]


@pytest.mark.parametrize("overrides, message", [
    # the default micro_batch_size (8) standing in for the misspelt 3 does not divide 12: not the user's doing
    ({"train.global_batch_size": 12, "train.micro_batchsize": 3},
     "train.micro_batchsize: is not a key of train; did you mean train.micro_batch_size?"),
    # workers 0 is refused; the default 1 would not match dp=3
    ({"resources.workers": 0, "parallel.dp": 3}, "resources.workers: must be greater than or equal to 1 (got 0)"),
    # the default model (gpt) standing in for an unknown one would refuse synthetic data
    ({"model": {"name": "resnet"}, "data": {"name": "synthetic"}, "train.loss": "mse"},
     "model.name must be 'gpt', 'mlp' or 'dlrm', or give model.hf or model.entrypoint (got 'resnet')"),
])
def test_a_default_standing_in_for_a_refused_value_causes_no_complaint(overrides, message):
    assert messages(tiny_spec(**overrides)) == [message]


def test_a_stored_spec_s_validation_error_reads_the_same():
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate(tiny_spec(**{"train.lr": -1}))
    assert format_validation_error(info.value) == [{"field": "train.lr",
                                                    "message": "train.lr: must be greater than 0 (got -1)"}]
