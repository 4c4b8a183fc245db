"""`model.moe`: its checks name the field, and the spec builds a GPT with MoE blocks."""

from __future__ import annotations

import pytest

from tests.helpers import spec_of, tiny_spec
from workers.models import build_model
from workers.models.gpt import MLP
from workers.models.moe import MoE
from workers.spec import SPEC_ERRORS, format_validation_error
from workers.spec_loading import parse_spec


@pytest.mark.parametrize("moe,field,words", [
    ({"experts": 4, "top_k": 5}, "model.moe.top_k", ["at most model.moe.experts", "top_k=5", "experts=4"]),
    ({"experts": 1, "top_k": 1}, "model.moe.experts", ["greater than or equal to 2"]),
    ({"experts": 4, "top_k": 0}, "model.moe.top_k", ["greater than or equal to 1"]),
    ({"experts": 4, "top_k": 1, "capacity_factor": 0}, "model.moe.capacity_factor", ["greater than 0"]),
    ({"experts": 4, "top_k": 1, "router": "x"}, "model.moe.router", ["is not a key of model.moe"]),
])
def test_moe_checks_name_the_field(moe, field, words):
    with pytest.raises(SPEC_ERRORS) as info:
        parse_spec(tiny_spec(**{"model.moe": moe}))
    errors = [e for e in format_validation_error(info.value) if e["field"] == field]
    assert errors, format_validation_error(info.value)
    for word in words:
        assert any(word in e["message"] for e in errors), (word, errors)


def test_spec_builds_moe_blocks_and_dense_by_default():
    spec = spec_of(**{"model.moe": {"experts": 4, "top_k": 2, "capacity_factor": 1.25}})
    assert (spec.model.moe.experts, spec.model.moe.aux_loss_weight) == (4, 0.01)
    moe = build_model(spec).blocks[0].mlp
    assert isinstance(moe, MoE) and (moe.experts, moe.top_k, moe.capacity_factor) == (4, 2, 1.25)
    dense = spec_of()
    assert dense.model.moe is None and isinstance(build_model(dense).blocks[0].mlp, MLP)


def test_tp_keeps_the_experts_whole_unless_the_models_own_plan_shards_its_mlps():
    """The MoE GPT's and Mixtral's plans shard attention only (the experts stay whole on every tp rank);
    Qwen3-MoE's own plan names the MLPs of its dense layers: refused without a model.tp_plan."""
    from tests.user_models import MIXTRAL_SPEC
    from workers.models.description import describe

    model = build_model(spec_of(**{"model.moe": {"experts": 4, "top_k": 2}}))
    assert describe(model).tp_plan and not any(".mlp." in key for key in describe(model).tp_plan)
    train = {"steps": 2, "global_batch_size": 16, "micro_batch_size": 4}
    parse_spec({**MIXTRAL_SPEC, "train": train, "resources": {"workers": 4}, "parallel": {"tp": 2, "ep": 2}})
    qwen = {"hf": {"model_type": "qwen3_moe", "config": {
        "hidden_size": 32, "intermediate_size": 64, "moe_intermediate_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "num_experts": 4}}}
    with pytest.raises(SPEC_ERRORS) as info:
        parse_spec({**MIXTRAL_SPEC, "model": qwen, "train": train, "resources": {"workers": 2}, "parallel": {"tp": 2}})
    assert any(e["field"] == "parallel.tp" and "shards the MLPs" in e["message"]
               for e in format_validation_error(info.value))
