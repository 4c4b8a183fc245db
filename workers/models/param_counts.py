"""Parameter counts the planner needs of any model: what a tensor-parallel plan shards, what the
norms hold. Counted on the model itself (the meta device is enough: only shapes are read)."""

from __future__ import annotations

import re

from torch import nn

# Which of a planned module's own parameters a style splits over the tp ranks. A rowwise layer
# splits its input dimension, so its bias is added once after the reduction and stays whole.
_SHARDED = {
    "colwise": ("weight", "bias"),
    "colwise_gather_output": ("weight", "bias"),
    "rowwise": ("weight",),
    "embedding_rowwise": ("weight",),
    "sequence_parallel": (),  # norms: replicated weights, only the activations are split
}


def glob_regex(pattern: str) -> re.Pattern:
    """A plan key as a regex: `*` stands for one FQN component ('model.layers.*.mlp' -> any layer)."""
    return re.compile(r"\.".join("[^.]+" if part == "*" else re.escape(part) for part in pattern.split(".")))


def tp_sharded_params(model: nn.Module, tp_plan: dict[str, str]) -> int:
    """Elements of the parameters the plan splits over the tp ranks (each counted once)."""
    rules = [(glob_regex(k), _SHARDED.get(style, ())) for k, style in tp_plan.items()]
    seen: set[int] = set()
    total = 0
    for name, module in model.named_modules():
        kinds = next((kinds for rx, kinds in rules if rx.fullmatch(name)), ())
        for kind in kinds:
            p = module._parameters.get(kind)
            if p is not None and id(p) not in seen:  # tied weights (embedding = head) count once
                seen.add(id(p))
                total += p.numel()
    return total


def norm_params(model: nn.Module) -> int:
    """Elements of the norm layers (LayerNorm, RMSNorm, ...: class name containing 'Norm')."""
    seen: set[int] = set()
    total = 0
    for module in model.modules():
        if "Norm" in type(module).__name__:
            for p in module.parameters(recurse=False):
                if id(p) not in seen:
                    seen.add(id(p))
                    total += p.numel()
    return total
