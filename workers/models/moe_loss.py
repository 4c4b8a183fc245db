"""The hook that adds the MoE load-balancing loss to the training loss.

The model's output stays the logits (every loss, strategy and pipeline stage reads it unchanged); each
MoE layer keeps its last forward's unweighted `aux_loss`, and the training loss is wrapped once:
`loss_fn = with_aux_loss(LOSSES[spec.train.loss], model)`. Wrapping the base loss, before the trainer's
accumulation and loss-scaling wrappers, scales the aux term exactly like the task loss. The layers are
found by walking `model.modules()`, so a DDP/FSDP wrapper or an expert-parallel model (a rank holding
a slice of the experts, its own tokens' router statistics) needs nothing more.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from workers.models.moe import MoE

LossFn = Callable[[Any, "torch.Tensor | None"], torch.Tensor]


def moe_layers(model: nn.Module) -> list[MoE]:
    return [m for m in model.modules() if isinstance(m, MoE)]


def moe_aux_loss(model: nn.Module) -> torch.Tensor | None:
    """sum over MoE layers of aux_loss_weight * aux_loss of their last forward; None without MoE layers."""
    layers = moe_layers(model)
    if not layers:
        return None
    terms = []
    for m in layers:
        if m.aux_loss is None:
            raise RuntimeError("moe_aux_loss: an MoE layer has not run a forward yet")
        terms.append(m.aux_loss_weight * m.aux_loss)
    return sum(terms[1:], terms[0])  # on the layers' own device and dtype


def with_aux_loss(loss_fn: LossFn, model: nn.Module) -> LossFn:
    """`loss_fn` plus the model's weighted aux loss; `loss_fn` itself for a model without MoE layers."""
    if not moe_layers(model):
        return loss_fn

    def total(outputs: Any, targets: torch.Tensor | None) -> torch.Tensor:
        aux = moe_aux_loss(model)
        assert aux is not None  # the model has MoE layers
        return loss_fn(outputs, targets) + aux

    return total
