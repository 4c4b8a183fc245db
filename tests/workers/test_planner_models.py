"""The planner on models other than the built-in GPT: counted from the model itself (no Ray)."""

from __future__ import annotations

import torch
from torch import nn

from tests.helpers import tiny_spec
from workers.models import build_model
from workers.models.param_counts import glob_regex, tp_sharded_params
from workers.parallel.planner import ModelFacts, estimate, plan
from workers.spec_loading import parse_spec

LLAMA = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 64}


def llama_spec(**overrides) -> dict:
    return tiny_spec(**{"model": {"hf": {"model_type": "llama", "config": LLAMA}},
                        "data": {"name": "text:pystdlib", "max_bytes": 200_000, "seq_len": 32},
                        "resources.workers": 4, **overrides})


def test_llama_facts_count_the_built_model():
    spec = parse_spec(llama_spec())
    model = build_model(spec)
    facts = ModelFacts.of(spec)
    assert facts.params == sum(p.numel() for p in model.parameters())
    assert (facts.layers, facts.d_model, facts.n_heads, facts.seq_len, facts.vocab) == (2, 64, 4, 32, 256)
    # Llama's own plan shards q/k/v/o and gate/up/down in every layer, lm_head and embed_tokens.
    sharded = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    by_hand = sum(p.numel() for n, p in model.named_parameters() if n.split(".")[-2] in sharded)
    by_hand += model.lm_head.weight.numel() + model.model.embed_tokens.weight.numel()
    # The same from the config: q, o 64x64; k, v 64x32 (2 kv heads of 16); gate, up, down 64x128.
    assert by_hand == 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128) + 2 * 256 * 64
    assert facts.tp_params == by_hand
    assert facts.layernorm_params == 2 * 2 * 64 + 64  # two RMSNorms per layer and the final one


def test_llama_fsdp_state_is_a_quarter_of_16_bytes_per_parameter():
    spec = parse_spec(llama_spec(**{"parallel": {"zero": 3}}))
    params = sum(p.numel() for p in build_model(spec).parameters())
    est = estimate(spec)
    assert est.strategy == "fsdp"
    assert est.model_state_bytes_per_rank == 16 * params // 4
    assert est.activation_bytes_per_rank > 0 and est.compute_s > 0


def test_llama_tensor_parallel_holds_a_share_of_the_sharded_parameters():
    spec = parse_spec(llama_spec(**{"parallel": {"tp": 2, "dp": 2}}))
    f = ModelFacts.of(spec)
    assert estimate(spec).model_state_bytes_per_rank == int(16 * (f.params - f.tp_params / 2))


def test_parallel_auto_resolves_for_a_llama():
    spec = parse_spec({**llama_spec(), "parallel": "auto"})
    assert spec.parallel.dp * spec.parallel.tp == 4
    result = plan(llama_spec())
    assert result.chosen is not None
    # tp=4 cannot split 2 key/value heads: refused by the spec rules, not estimated.
    assert any(r["parallel"]["tp"] == 4 for r in result.rejected)
    assert all(e.parallel["tp"] in (1, 2) for e in result.candidates)


class _Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8)) for _ in range(3))
        self.norm = nn.LayerNorm(8)


def test_plan_globs_match_one_component_and_styles_pick_parameters():
    assert glob_regex("layers.*.0").fullmatch("layers.12.0")
    assert not glob_regex("layers.*.0").fullmatch("layers.1.2.0")
    with torch.device("meta"):
        m = _Stack()
    plan_ = {"layers.*.0": "colwise", "layers.*.2": "rowwise", "emb": "embedding_rowwise", "norm": "sequence_parallel"}
    # colwise: weight and bias; rowwise: the weight only (its bias stays whole); the norm: nothing.
    assert tp_sharded_params(m, plan_) == 3 * (8 * 16 + 16) + 3 * (16 * 8) + 10 * 8
