"""What one forward pass of the full model on a sample micro-batch shows a pipeline.

- which parts come before the blocks and which after (the order the forward calls them in);
- the shape each before-part returns for its input, so that a later stage can stand in for it
  with zeros of that shape (embeddings: the input's shape plus the width);
- the model's input (a stage that is not first feeds the model a dummy of that shape and dtype),
  the hidden state between blocks (what the stages send each other), and the output's shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from workers.model_io import Inputs, UserModelError, logits_of
from workers.models.description import ModelDescription, ModelStructureError, call_order
from workers.parallel.pipeline.parts import Parts, outside_parts, parts_by_call_order


@dataclass(frozen=True)
class ShapeRule:
    """Output shape = the input's first `keep` dimensions + `tail` (from one observed call)."""
    keep: int
    tail: tuple[int, ...]
    dtype: torch.dtype

    @classmethod
    def observed(cls, given: torch.Tensor, got: torch.Tensor) -> "ShapeRule":
        keep = 0
        while keep < min(given.ndim, got.ndim) and given.shape[keep] == got.shape[keep]:
            keep += 1
        return cls(keep, tuple(got.shape[keep:]), got.dtype)

    def shape_for(self, given: torch.Tensor) -> tuple[int, ...]:
        return tuple(given.shape[:self.keep]) + self.tail


@dataclass(frozen=True)
class Probe:
    parts: Parts
    part_outputs: dict[str, ShapeRule]  # the before-parts' that the forward calls
    input_shape: tuple[int, ...]
    input_dtype: torch.dtype
    hidden_shape: tuple[int, ...]  # what block 0 receives; every block passes on the same
    hidden_dtype: torch.dtype
    output: ShapeRule  # the model's output (logits) for its input


def first_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return value
    return None


def probe(model: nn.Module, desc: ModelDescription, sample: Inputs) -> Probe:
    if not isinstance(sample, torch.Tensor):
        raise UserModelError(f"parallel.pp > 1 takes batches whose input is one tensor (token ids), got "
                             f"{type(sample).__name__}: the stages pass one hidden state between them")
    calls: dict[str, ShapeRule] = {}
    hidden: list[torch.Tensor | None] = []
    outputs: list[torch.Tensor] = []

    def recorder(name):
        def hook(module, args, kwargs, output):
            given = first_tensor(args, kwargs)
            if name not in calls and given is not None and isinstance(output, torch.Tensor):
                calls[name] = ShapeRule.observed(given, output)
        return hook

    handles = [model.get_submodule(n).register_forward_hook(recorder(n), with_kwargs=True)
               for n in outside_parts(model, desc.blocks_path)]
    handles.append(desc.blocks(model)[0].register_forward_pre_hook(
        lambda m, args, kwargs: hidden.append(first_tensor(args, kwargs)) if not hidden else None, with_kwargs=True))
    was_training = model.training
    model.eval()  # no dropout draws: the probe must not move the random stream the training draws from
    try:
        order = call_order(model, lambda: outputs.append(logits_of(model(sample))))
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()
    parts = parts_by_call_order(model, desc, order)
    missing = [p for p in parts.before if p in order and p not in calls]
    if missing:
        raise ModelStructureError("model.blocks", f"{missing} run before the blocks but return no single tensor "
                                                  f"for a tensor input: a later stage cannot stand in for them")
    [h] = hidden
    assert h is not None, "the first block was called without a tensor (its input is the hidden state)"
    return Probe(parts, {p: calls[p] for p in parts.before if p in calls}, tuple(sample.shape), sample.dtype,
                 tuple(h.shape), h.dtype, ShapeRule.observed(sample, outputs[0]))
