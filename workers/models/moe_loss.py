"""The hook that adds the MoE load-balancing loss to the training loss.

The model's output stays the logits (every loss, strategy and pipeline stage reads it unchanged); each
MoE layer keeps its last forward's unweighted `aux_loss`, and the training loss is wrapped once:
`loss_fn = with_aux_loss(LOSSES[spec.train.loss], model)`. Wrapping the base loss, before the trainer's
accumulation and loss-scaling wrappers, scales the aux term exactly like the task loss. The layers are
found by walking `model.modules()`, so a DDP/FSDP wrapper or an expert-parallel model (a rank holding
a slice of the experts, its own tokens' router statistics) needs nothing more.

Hugging Face MoE models (Mixtral, Qwen3-MoE) get their own router aux loss (workers/models/hf_moe.py:
transformers' load_balancing_loss_func over all layers, times config.router_aux_loss_coef), recorded by
hooks that `with_aux_loss` installs. It is not added when the model's output already carries it in its
own loss (`output.loss` and `output.aux_loss` both set: train.loss `model` with output_router_logits).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import torch
from torch import nn

from workers.models.hf_moe import hf_aux_loss, hf_experts_modules, track_hf_moe
from workers.models.moe import MoE

LossFn = Callable[[Any, "torch.Tensor | None"], torch.Tensor]


def moe_layers(model: nn.Module) -> list[MoE]:
    return [m for m in model.modules() if isinstance(m, MoE)]


def moe_aux_loss(model: nn.Module) -> torch.Tensor | None:
    """sum over MoE layers of aux_loss_weight * aux_loss of their last forward, plus an HF MoE model's
    weighted router aux loss; None without MoE layers."""
    layers = moe_layers(model)
    hf = [m for m, _ in hf_experts_modules(model)]
    terms = ([_own_aux_loss(layers)] if layers else []) + ([hf_aux_loss(hf)] if hf else [])
    return sum(terms[1:], terms[0]) if terms else None


def _own_aux_loss(layers: list[MoE]) -> torch.Tensor:
    terms = []
    for m in layers:
        if m.aux_loss is None:
            raise RuntimeError("moe_aux_loss: an MoE layer has not run a forward yet")
        terms.append(m.aux_loss_weight * m.aux_loss)
    return sum(terms[1:], terms[0])  # on the layers' own device and dtype


def with_aux_loss(loss_fn: LossFn, model: nn.Module) -> LossFn:
    """`loss_fn` plus the model's weighted aux loss; `loss_fn` itself for a model without MoE layers."""
    if not moe_layers(model) and not track_hf_moe(model):
        return loss_fn

    def total(outputs: Any, targets: torch.Tensor | None) -> torch.Tensor:
        if _carries_own_aux(outputs):
            return loss_fn(outputs, targets)
        aux = moe_aux_loss(model)
        assert aux is not None  # the model has MoE layers
        return loss_fn(outputs, targets) + aux

    return total


def _carries_own_aux(outputs: Any) -> bool:
    """A transformers output whose `loss` already includes its router aux loss."""
    get = outputs.get if isinstance(outputs, Mapping) else (lambda k: getattr(outputs, k, None))
    return get("loss") is not None and get("aux_loss") is not None
