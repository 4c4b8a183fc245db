"""Cutting any model with repeated blocks into pipeline stages, in one process (no cluster): the
stages compose to the full model's forward, hold disjoint parameters under the full model's names,
and a stage that is not first holds no embedding, one that is not last no head."""

from __future__ import annotations

import copy

import pytest
import torch

from workers.models import build_model
from workers.models.description import describe_spec_model
from workers.parallel.pipeline.costs import unit_costs
from workers.parallel.pipeline.probe import probe
from workers.parallel.pipeline.split import plan_stages, stage_to_rank
from workers.parallel.pipeline.stage import (
    FullNames,
    StageModule,
    pruned_copy,
    replacements_for,
)
from workers.spec_loading import parse_spec

LLAMA = {"hf": {"model_type": "llama", "config": {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 64}}}
GPT2 = {"hf": {"model_type": "gpt2", "config": {
    "n_layer": 3, "n_embd": 32, "n_head": 2, "vocab_size": 256, "n_positions": 64, "tie_word_embeddings": False,
    "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}}}
USER = {"entrypoint": "tests.fixtures.block_models:token_mlp", "args": {"width": 32, "depth": 3}}
GPT = {"name": "gpt", "n_layers": 4, "d_model": 32, "n_heads": 2, "seq_len": 32}

# (model section, the embedding's and the head's parameter names)
MODELS = {
    "llama": (LLAMA, "model.embed_tokens.weight", "lm_head.weight"),
    "gpt2": (GPT2, "transformer.wte.weight", "lm_head.weight"),
    "user": (USER, "embed.weight", "out.weight"),
    "gpt": (GPT, "tok_emb.weight", "head.weight"),
}


def spec_for(model: dict, pp: int = 2, **pipeline):
    return parse_spec({
        "name": "cut", "model": model, "data": {"name": "text:pystdlib", "max_bytes": 200_000, "seq_len": 16},
        "train": {"steps": 2, "global_batch_size": 8, "micro_batch_size": 2},
        "resources": {"workers": pp}, "parallel": {"pp": pp, "pipeline": pipeline or None},
    }, allow_fault_injection=True)


def cut(spec, n_stages, pp, v_shape=False):
    full = build_model(spec)
    reference = copy.deepcopy(full)
    desc = describe_spec_model(full, spec.model)
    ids = torch.randint(0, 256, (2, 16))
    seen = probe(full, desc, ids)
    plans = plan_stages(spec, n_stages, spec.parallel.pipeline.split if spec.parallel.pipeline else None)
    chunks = [StageModule(full, desc, seen, p.blocks, p.has_embedding, p.has_head) for p in plans]
    ranks = []
    for r in range(pp):
        mine = [p for p in plans if stage_to_rank(p.stage, pp, v_shape) == r]
        holder = FullNames()
        holder.adopt(pruned_copy(full, replacements_for(full, desc, seen, tuple(i for p in mine for i in p.blocks),
                                                        any(p.has_embedding for p in mine),
                                                        any(p.has_head for p in mine), runnable=False)))
        ranks.append(holder)
    return reference, ids, plans, chunks, ranks


@pytest.mark.parametrize("name", MODELS)
def test_stages_compose_to_the_full_forward_under_full_names(name):
    model, embedding, head = MODELS[name]
    spec = spec_for(model)
    reference, ids, plans, chunks, ranks = cut(spec, 2, 2)
    names = set(reference.state_dict())
    held = [set(r.state_dict()) for r in ranks]
    assert held[0] | held[1] == names and not held[0] & held[1]
    assert embedding in held[0] and embedding not in held[1]  # the second stage holds no embedding
    assert head in held[1] and head not in held[0]  # the first no head
    assert not any(n.endswith(embedding) for n, _ in chunks[1].named_parameters())
    x, expected = _through_stages_and_whole(reference, chunks, ids)


@pytest.mark.parametrize("name", ["llama", "gpt"])
def test_pinned_and_interleaved_stages_compose_and_backpropagate(name):
    model, _, _ = MODELS[name]
    spec = spec_for(model, schedule="interleaved_1f1b", virtual_stages=2, split=[0, 2, 2, 0])
    reference, ids, plans, chunks, ranks = cut(spec, 4, 2)
    assert [p.describe() for p in plans] == ["embedding", "blocks 0-1", "blocks 2-3", "head"]
    assert [len(list(c.parameters())) > 0 for c in chunks] == [True, True, True, True]
    x, expected = _through_stages_and_whole(reference, chunks, ids)
    x.sum().backward()
    expected.sum().backward()
    ref = dict(reference.named_parameters())
    for r in ranks:
        for n, p in r.named_parameters():
            assert torch.allclose(p.grad, ref[n].grad, rtol=1e-5, atol=1e-7), n


def test_costs_come_from_the_model():
    costs = unit_costs(spec_for(LLAMA))
    assert len(costs) == 6 and len(set(costs[1:5])) == 1  # embedding, 4 equal blocks, head
    assert costs[0] < costs[1] and costs[5] > costs[0]  # an embedding is a lookup; the head is a matmul
    gpt = unit_costs(spec_for({**GPT, "vocab_size": 8192}))
    assert gpt[-1] > 2 * gpt[1]  # a large vocabulary makes the head the heaviest unit


def test_parts_are_found_by_call_order_and_loose_parameters_are_refused():
    from torch import nn

    from workers.models.description import ModelStructureError, call_order, describe
    from workers.parallel.pipeline.parts import parts_by_call_order

    spec = spec_for(LLAMA)
    full = build_model(spec)
    desc = describe_spec_model(full, spec.model)
    order = call_order(full, lambda: full(torch.zeros(1, 8, dtype=torch.long)))
    parts = parts_by_call_order(full, desc, order)
    # rotary_emb holds no parameters: every stage keeps and runs it, so it is no part
    assert parts.before == ("model.embed_tokens",) and parts.after == ("model.norm", "lm_head")

    class Loose(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(4))
            self.blocks = nn.ModuleList(nn.Linear(4, 4) for _ in range(2))

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return x * self.scale

    loose = Loose()
    with pytest.raises(ModelStructureError, match="directly beside the blocks"):
        probe(loose, describe(loose), torch.zeros(2, 4))


def _through_stages_and_whole(reference, chunks, ids):
    """The stages run one after another, and the full model: their outputs must be identical."""
    x = ids
    for chunk in chunks:
        x = chunk(x)
    expected = reference(ids)
    expected = expected if isinstance(expected, torch.Tensor) else expected.logits
    assert torch.equal(x, expected)
    return x, expected
