"""Tokens routed to each expert in a step, summed over the model's MoE layers (built-in or Hugging Face):
what the supervisor turns into the job's expert-load imbalance (the busiest expert over the mean; 1 is
perfectly balanced)."""

from __future__ import annotations

import torch
from torch import nn

from workers.models.hf_moe import track_hf_moe
from workers.models.moe import MoE


def _in_backward() -> bool:
    """An activation-checkpointed block runs its forward again during backward: not new tokens."""
    return torch._C._current_graph_task_id() != -1


class ExpertLoad:
    """Forward hooks on every MoE layer add up `tokens_per_expert` (global expert ids) until `take()`."""

    def __init__(self, model: nn.Module) -> None:
        # the built-in GPT's MoE layers and a Hugging Face model's experts modules (their tokens_per_expert
        # set by track_hf_moe's pre-hooks, before this forward hook reads it)
        self.layers = [m for m in model.modules() if isinstance(m, MoE)] + track_hf_moe(model)
        self.total: torch.Tensor | None = None
        for layer in self.layers:
            layer.register_forward_hook(self._count)

    def _count(self, module, args, output) -> None:
        if module.tokens_per_expert is None or _in_backward():
            return
        routed = module.tokens_per_expert.detach().to("cpu", torch.int64)
        self.total = routed if self.total is None else self.total + routed

    def take(self) -> list[int] | None:
        """This rank's tokens per expert since the last take (None for a dense model or no forward)."""
        total, self.total = self.total, None
        return None if total is None else [int(n) for n in total]


def expert_load(model: nn.Module, tp_rank: int = 0) -> ExpertLoad | None:
    """None for a dense model, and on all but the first rank of a tp group: its peers route the same tokens."""
    if tp_rank:
        return None
    load = ExpertLoad(model)
    return load if load.layers else None
