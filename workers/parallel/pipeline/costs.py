"""Estimated forward cost of each pipeline unit, from the model itself: [before, block 0..L-1, after].

A dense layer costs about 2 FLOPs per weight per token, so a unit costs 2 x tokens x its
parameters, except embedding tables, which are looked up (one row per token: 2 x tokens x width).
Nothing here knows a model by name. The estimate leaves out what parameters do not show
(attention's tokens^2 term, elementwise ops); the measured rebalance
(`parallel.pipeline.rebalance_threshold`) corrects a split for what it misses.

The supervisor needs the same costs as the workers (it reports the split and re-splits by
measured cost) but holds no model: `unit_costs(spec)` builds the spec's model on the meta device
(no memory, no weights) and tells the parts apart by registration order, on both sides.
"""

from __future__ import annotations

import json

import torch
from torch import nn

from workers.models.description import blocks_at, describe_spec_model
from workers.parallel.pipeline.parts import Parts, parts_by_registration
from workers.spec import JobSpec, sequence_length


def module_cost(module: nn.Module, tokens: int) -> float:
    cost = 0.0
    for sub in module.modules():
        own = list(sub.parameters(recurse=False))
        if isinstance(sub, nn.Embedding):
            cost += 2.0 * tokens * sub.embedding_dim
        else:
            cost += 2.0 * tokens * sum(p.numel() for p in own)
    return cost


def unit_costs_of(model: nn.Module, blocks_path: str, parts: Parts, tokens: int) -> list[float]:
    blocks = blocks_at(model, blocks_path)
    before = sum(module_cost(model.get_submodule(p), tokens) for p in parts.before)
    after = sum(module_cost(model.get_submodule(p), tokens) for p in parts.after)
    return [before] + [module_cost(b, tokens) for b in blocks] + [after]


def unit_costs(spec: JobSpec) -> list[float]:
    """Estimated forward FLOPs per sequence of [embedding, block 0..L-1, head] of the spec's model."""
    key = (json.dumps(spec.model.model_dump(mode="json"), sort_keys=True), sequence_length(spec) or 1)
    if key not in _COSTS:  # a model build per summary or rebalance check would be wasted work
        model = _meta_model(spec)
        desc = describe_spec_model(model, spec.model)
        _COSTS[key] = tuple(unit_costs_of(model, desc.blocks_path, parts_by_registration(model, desc), key[1]))
    return list(_COSTS[key])


_COSTS: dict[tuple[str, int], tuple[float, ...]] = {}


def _meta_model(spec: JobSpec) -> nn.Module:
    """The spec's model without weights; the global RNG is left as it was (build_model seeds it)."""
    from workers.models import build_model

    with torch.random.fork_rng(devices=[]):
        try:
            with torch.device("meta"):
                return build_model(spec)
        except Exception:  # a user constructor that cannot run on meta (it reads a file, calls .item())
            return build_model(spec)


if __name__ == "__main__":  # unit_costs_apart.py's child: a spec's JSON in, its unit costs out
    import sys

    print(json.dumps(unit_costs(JobSpec.model_validate_json(sys.stdin.read()))))
