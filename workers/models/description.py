"""What the parallel strategies need to know of a model they have never seen.

- the repeated blocks: the spec's `model.blocks`, else the largest ModuleList whose children
  all share one class (GPT `blocks`, Llama `model.layers`, GPT-2 `transformer.h`);
- the tensor-parallel plan, as {module FQN glob from the root: style}: the spec's
  `model.tp_plan`, else transformers' own (`base_model_tp_plan` under the base model's prefix
  and the causal LM's `_tp_plan`), else the built-in GPT's;
- the modules before and after the blocks (embeddings; final norm and head), found by the order
  a forward pass calls them in, for the pipeline's first and last stages.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from workers.spec.errors import FieldError

GPT_TP_PLAN = {
    "blocks.*.attn.q": "colwise", "blocks.*.attn.k": "colwise", "blocks.*.attn.v": "colwise",
    "blocks.*.attn.proj": "rowwise", "blocks.*.mlp.fc": "colwise", "blocks.*.mlp.proj": "rowwise",
}


class ModelStructureError(FieldError):
    """The model lacks what a strategy needs (blocks, a plan)."""


@dataclass(frozen=True)
class ModelDescription:
    blocks_path: str  # FQN of the ModuleList of repeated blocks
    n_blocks: int
    tp_plan: dict[str, str] = field(default_factory=dict)  # empty: no plan known

    def blocks(self, model: nn.Module) -> nn.ModuleList:
        return blocks_at(model, self.blocks_path)

    def block_fqn(self, i: int) -> str:
        return f"{self.blocks_path}.{i}"


def blocks_at(model: nn.Module, path: str) -> nn.ModuleList:
    """The ModuleList of repeated blocks at `path` (a blocks_path, which find_blocks checked is one)."""
    blocks = model.get_submodule(path)
    assert isinstance(blocks, nn.ModuleList), f"{path!r} is a {type(blocks).__name__}, not an nn.ModuleList"
    return blocks


def find_blocks(model: nn.Module, given: str | None) -> str:
    """The FQN of the repeated blocks."""
    if given is not None:
        try:
            found = model.get_submodule(given)
        except AttributeError:
            raise ModelStructureError("model.blocks", f"the model has no submodule {given!r}") from None
        if not isinstance(found, nn.ModuleList) or len(found) == 0:
            raise ModelStructureError("model.blocks", f"{given!r} is a {type(found).__name__}, not a non-empty "
                                                      f"nn.ModuleList of blocks")
        return given
    best, size = None, 0
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) > size \
                and len({type(child) for child in module}) == 1:
            best, size = name, len(module)
    if best is None:
        raise ModelStructureError("model.blocks", "the model has no nn.ModuleList of same-class blocks; name "
                                                  "the repeated layers with model.blocks (e.g. 'model.layers')")
    return best


def own_tp_plan(model: nn.Module) -> dict[str, str]:
    """The model's own plan: transformers' base_model_tp_plan (+ the head's _tp_plan), or the GPT's."""
    config = getattr(model, "config", None)
    base = getattr(config, "base_model_tp_plan", None) if config is not None else None
    if base:
        prefix = getattr(model, "base_model_prefix", "")
        plan = {f"{prefix}.{k}" if prefix and hasattr(model, prefix) else k: v for k, v in base.items()}
        plan.update(getattr(model, "_tp_plan", None) or {})
        return dict(plan)
    from workers.models.gpt import GPT

    if not isinstance(model, GPT):
        return {}
    # an MoE GPT's MLP is the experts: they stay whole on every tp rank (expert parallelism shards them)
    return {k: v for k, v in GPT_TP_PLAN.items() if model.moe is None or ".mlp." not in k}


def describe(model: nn.Module, blocks: str | None = None, tp_plan: dict[str, str] | None = None) -> ModelDescription:
    path = find_blocks(model, blocks)
    plan = dict(tp_plan) if tp_plan is not None else own_tp_plan(model)
    return ModelDescription(path, len(blocks_at(model, path)), plan)


def describe_spec_model(model: nn.Module, spec_model) -> ModelDescription:
    """The description of a model built from a spec's `model` section (its blocks/tp_plan overrides)."""
    return describe(model, getattr(spec_model, "blocks", None), getattr(spec_model, "tp_plan", None))


def call_order(model: nn.Module, run) -> list[str]:
    """FQNs of the modules `run()` calls, in first-call order (one forward pass, no gradients)."""
    order: list[str] = []
    names = {id(m): n for n, m in model.named_modules()}
    seen: set[int] = set()

    def hook(module, args):
        if id(module) not in seen:
            seen.add(id(module))
            order.append(names[id(module)])

    handles = [m.register_forward_pre_hook(hook) for m in model.modules()]
    try:
        with torch.no_grad():
            run()
    finally:
        for h in handles:
            h.remove()
    return order
