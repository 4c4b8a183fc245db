"""A Mixture-of-Experts feed-forward layer: top-k token routing over stacked expert MLPs.

The experts are held as stacked weights (`w1: [E, d, 4d]`, `w2: [E, 4d, d]`) so that sharding
experts over ranks is slicing dim 0 (workers/parallel/expert_parallel.py), and a checkpoint can
save them as a DTensor Shard(0) that DCP reshards between expert-parallel degrees.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn import functional as F


@dataclass(frozen=True)
class MoEConfig:
    """The GPT's `moe` options (the spec's `model.moe`)."""
    experts: int
    top_k: int
    capacity_factor: float | None = None
    aux_loss_weight: float = 0.01


@dataclass
class Routing:
    """One forward's routing: assignments (token, slot) sorted by expert, drops already removed."""
    order: torch.Tensor    # [N] indices into the flat (token * top_k + slot) assignments, expert-major
    counts: torch.Tensor   # [E] kept assignments per expert (sums to N)


class Dispatch(Protocol):
    """Takes rows xs [N, d] sorted by global expert (`counts` [E] per expert), returns the experts' outputs
    in the same order."""

    def __call__(self, moe: "MoE", xs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor: ...


def _local(weight: torch.Tensor) -> torch.Tensor:
    """This rank's experts of a stacked weight: its shard under expert parallelism (a DTensor, Shard(0) over
    the ep ranks, so that checkpoints and optimiser state reshard between ep degrees), else all of it."""
    return weight.to_local() if isinstance(weight, DTensor) else weight


class LocalExperts:
    """Runs every expert in this process: the default dispatch. Expert parallelism swaps in another."""

    def __call__(self, moe: "MoE", xs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return moe.run_experts(xs, counts)


class MoE(nn.Module):
    """Replaces the dense MLP: a bias-free router picks `top_k` of `experts` GELU MLPs per token.

    Gates: softmax over all experts, then the top-k probabilities renormalised to sum to 1 (Mixtral).
    Capacity: with `capacity_factor` None no assignment is dropped. With a factor, each expert takes at
    most ceil(capacity_factor * tokens * top_k / experts) assignments, the earliest tokens of the batch
    first; an overflow assignment contributes nothing, so a token all of whose slots overflow passes
    through the block's residual connection only (its other slots' gates are not renormalised).
    After each forward:
      `aux_loss`: the load-balancing loss E * sum_e f_e * P_e (Switch Transformer), f_e the fraction of
        routed assignments (before drops) sent to expert e, P_e the mean router probability of e; 1 when
        perfectly balanced. Unweighted: the loss hook (workers/models/moe_loss.py) scales it by
        `aux_loss_weight`.
      `tokens_per_expert`: routed assignments per expert, before drops ([E] int64; sums to tokens*top_k).
      `tokens_dropped`: assignments dropped by the capacity (a 0-d int64 tensor).
    """

    def __init__(self, d_model: int, experts: int, top_k: int, capacity_factor: float | None = None,
                 aux_loss_weight: float = 0.01, dropout: float = 0.0):
        super().__init__()
        if experts < 2 or not 1 <= top_k <= experts:
            raise ValueError(f"MoE needs experts >= 2 and 1 <= top_k <= experts (experts={experts}, top_k={top_k})")
        if capacity_factor is not None and capacity_factor <= 0:
            raise ValueError(f"MoE capacity_factor must be > 0 or None (capacity_factor={capacity_factor})")
        self.experts, self.top_k = experts, top_k
        self.capacity_factor, self.aux_loss_weight = capacity_factor, aux_loss_weight
        self.router = nn.Linear(d_model, experts, bias=False)
        hidden = 4 * d_model
        self.w1 = nn.Parameter(torch.empty(experts, d_model, hidden))
        self.b1 = nn.Parameter(torch.empty(experts, hidden))
        self.w2 = nn.Parameter(torch.empty(experts, hidden, d_model))
        self.b2 = nn.Parameter(torch.empty(experts, d_model))
        self.drop = nn.Dropout(dropout)
        self.expert_offset = 0  # global id of w1[0]: nonzero once expert parallelism keeps a slice
        self.dispatch: Dispatch = LocalExperts()
        self.aux_loss: torch.Tensor | None = None
        self.tokens_per_expert: torch.Tensor | None = None
        self.tokens_dropped: torch.Tensor | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # the dense GPT's init: normal(0, 0.02) weights, zero biases
        for w in (self.router.weight, self.w1, self.w2):
            nn.init.normal_(w, mean=0.0, std=0.02)
        nn.init.zeros_(self.b1)
        nn.init.zeros_(self.b2)

    @property
    def local_experts(self) -> int:
        return _local(self.w1).shape[0]

    def capacity(self, tokens: int) -> int | None:
        if self.capacity_factor is None:
            return None
        return math.ceil(self.capacity_factor * tokens * self.top_k / self.experts)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, Routing]:
        """Gates [T, k] and the expert-major order of the kept assignments, for tokens x [T, d]."""
        logits = self.router(x)
        probs = logits.softmax(-1, dtype=torch.promote_types(logits.dtype, torch.float32))
        top, experts = probs.topk(self.top_k, dim=-1)
        gates = (top / top.sum(-1, keepdim=True)).to(x.dtype)
        flat = experts.reshape(-1)
        routed = torch.bincount(flat, minlength=self.experts)
        order = torch.argsort(flat, stable=True)  # expert-major, token order within an expert
        kept = routed
        cap = self.capacity(x.shape[0])
        if cap is not None:
            starts = torch.cumsum(routed, 0) - routed
            position = torch.arange(flat.numel(), device=x.device) - starts[flat[order]]
            order = order[position < cap]
            kept = routed.clamp(max=cap)
        share = routed.to(probs.dtype) / flat.numel()  # f_e: a count, carries no gradient
        self.aux_loss = self.experts * (share * probs.mean(0)).sum()
        self.tokens_per_expert = routed.detach()
        self.tokens_dropped = (routed - kept).sum()
        return gates, Routing(order, kept)

    def run_experts(self, xs: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """This process's experts on xs [N, d], grouped by local expert as `counts` [local_experts] says.
        One matmul per expert (E is small), none per token. An expert with no rows still runs (on none):
        the result stays in the autograd graph, so under expert parallelism every rank's backward runs
        the same all-to-alls."""
        chunks = torch.split(xs, counts.tolist())
        # in the rows' dtype: FSDP's mixed precision casts the parameters it holds, not the expert shards it leaves
        w1, b1, w2, b2 = (_local(w).to(xs.dtype) for w in (self.w1, self.b1, self.w2, self.b2))
        return torch.cat([F.gelu(c @ w1[e] + b1[e]) @ w2[e] + b2[e] for e, c in enumerate(chunks)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        gates, routing = self.route(x)
        token = routing.order // self.top_k
        ys = self.dispatch(self, x[token], routing.counts)
        weighted = ys * gates.reshape(-1)[routing.order].unsqueeze(-1)
        out = torch.zeros_like(x).index_add(0, token, weighted)
        return self.drop(out).view(shape)
