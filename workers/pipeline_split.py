"""Cutting a GPT into pipeline stages: per-unit costs, a balanced contiguous split, and stage modules.

The units of splitting are, in order, the embedding (tok_emb + pos_emb), every
transformer block, and the head (ln_f + head). A stage is a contiguous run of
units. Costs are estimated forward FLOPs per sequence (backward is about twice
the forward for every unit, so the ratio is the same); the split minimises the
most expensive stage (the pipeline runs at the pace of its slowest stage).

Stage modules keep the full model's attribute names, so parameter FQNs are the
same on whichever rank holds them (`blocks.3.attn.qkv.weight`): checkpoints
written under one layout load under any other.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from workers.spec import JobSpec


@dataclass(frozen=True)
class StagePlan:
    stage: int
    blocks: tuple[int, ...]
    has_embedding: bool
    has_head: bool
    cost: float  # estimated forward FLOPs per sequence

    def describe(self) -> str:
        parts = ["embedding"] if self.has_embedding else []
        if self.blocks:
            first, last = self.blocks[0], self.blocks[-1]
            parts.append(f"blocks {first}-{last}" if last > first else f"block {first}")
        return " + ".join(parts + (["head"] if self.has_head else []))

    def to_dict(self) -> dict:
        return {"stage": self.stage, "blocks": list(self.blocks), "embedding": self.has_embedding,
                "head": self.has_head, "cost": self.cost, "describe": self.describe()}


def unit_costs(spec: JobSpec) -> list[float]:
    """Estimated forward FLOPs per sequence of [embedding, block 0..L-1, head]."""
    m = spec.model
    t, d, v = m.seq_len, m.d_model, m.vocab_size
    embedding = 2.0 * t * d  # two gathers and an add: memory-bound, tiny
    # qkv + proj + two MLP matmuls (24 t d^2) plus the attention scores and the weighted sum (4 t^2 d)
    # plus layer norms, GELU and residual adds (~30 t d elementwise).
    block = 24.0 * t * d * d + 4.0 * t * t * d + 30.0 * t * d
    # ln_f + the vocabulary projection + softmax/cross-entropy over the vocabulary.
    head = 2.0 * t * d * v + 10.0 * t * d + 5.0 * t * v
    return [embedding] + [block] * m.n_layers + [head]


def balanced_split(costs: list[float], n_stages: int) -> list[int]:
    """Units per stage, contiguous and non-empty, minimising the largest stage cost (exact DP)."""
    n = len(costs)
    if not 1 <= n_stages <= n:
        raise ValueError(f"cannot cut {n} units into {n_stages} non-empty stages")
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[k][i]: minimal max-stage-cost of the first i units in k stages; cut[k][i]: where the last stage starts.
    best = [[inf] * (n + 1) for _ in range(n_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(n_stages + 1)]
    best[0][0] = 0.0
    for k in range(1, n_stages + 1):
        for i in range(k, n - (n_stages - k) + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i] - 1e-9 * abs(value):  # strict: ties keep the earliest cut
                    best[k][i], cut[k][i] = value, j
    sizes, i = [], n
    for k in range(n_stages, 0, -1):
        j = cut[k][i]
        sizes.append(i - j)
        i = j
    return sizes[::-1]


def plan_stages(spec: JobSpec, n_stages: int, split: list[int] | None = None) -> list[StagePlan]:
    """The stage plans: `split` pins blocks per stage; otherwise balanced by estimated cost."""
    costs = unit_costs(spec)
    n_layers = spec.model.n_layers
    if split is None:
        units = balanced_split(costs, n_stages)
    else:  # blocks per stage -> units per stage (embedding on the first, head on the last)
        units = list(split)
        units[0] += 1
        units[-1] += 1
    plans, start = [], 0
    for s, count in enumerate(units):
        unit_ids = range(start, start + count)
        blocks = tuple(u - 1 for u in unit_ids if 1 <= u <= n_layers)
        plans.append(StagePlan(stage=s, blocks=blocks, has_embedding=0 in unit_ids,
                               has_head=(n_layers + 1) in unit_ids,
                               cost=sum(costs[u] for u in unit_ids)))
        start += count
    return plans


class GPTStage(nn.Module):
    """One pipeline stage of a GPT: the owned parts of the full model, under the full model's names."""

    def __init__(self, full: nn.Module, plans: list[StagePlan]):
        super().__init__()
        if any(p.has_embedding for p in plans):
            self.tok_emb, self.pos_emb, self.drop = full.tok_emb, full.pos_emb, full.drop
        # ModuleDict keyed by the block's index keeps FQNs `blocks.<i>.…` identical to the full model.
        self.blocks = nn.ModuleDict({str(i): full.blocks[i] for p in plans for i in p.blocks})
        if any(p.has_head for p in plans):
            self.ln_f, self.head = full.ln_f, full.head
        self.plans = plans

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # only for a single-stage rank
        assert len(self.plans) == 1
        return run_stage(self, self.plans[0], x)


class StageChunk(nn.Module):
    """The module torch's PipelineStage runs for one stage; shares parameters with the rank's GPTStage."""

    def __init__(self, owner: GPTStage, plan: StagePlan):
        super().__init__()
        self.plan = plan
        if plan.has_embedding:
            self.tok_emb, self.pos_emb, self.drop = owner.tok_emb, owner.pos_emb, owner.drop
        self.blocks = nn.ModuleDict({str(i): owner.blocks[str(i)] for i in plan.blocks})
        if plan.has_head:
            self.ln_f, self.head = owner.ln_f, owner.head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return run_stage(self, self.plan, x)


def run_stage(module: nn.Module, plan: StagePlan, x: torch.Tensor) -> torch.Tensor:
    """The same arithmetic as GPT.forward, restricted to the stage's units."""
    if plan.has_embedding:
        pos = torch.arange(x.shape[1], device=x.device)
        x = module.drop(module.tok_emb(x) + module.pos_emb(pos))
    for i in plan.blocks:
        x = module.blocks[str(i)](x)
    if plan.has_head:
        x = module.head(module.ln_f(x))
    return x


def stage_to_rank(stage: int, pp: int, v_shape: bool) -> int:
    """Looped placement puts stage s on rank s % pp; V placement goes 0..pp-1 then back pp-1..0."""
    if not v_shape:
        return stage % pp
    return stage if stage < pp else 2 * pp - 1 - stage


def rebalanced_split(spec: JobSpec, busy_s: list[float], threshold: float) -> list[int] | None:
    """Blocks per stage re-balanced by *measured* cost, or None when stages are within `threshold`.

    Each stage's measured busy time is shared among its units in proportion to their estimated
    cost; the balanced split of those measured unit costs is the new split. Single-stage schedules
    only (one stage per rank, so a rank's busy time is its stage's).
    """
    if min(busy_s) <= 0 or max(busy_s) / min(busy_s) - 1.0 <= threshold:
        return None
    pipe = spec.parallel.pipeline
    plans = plan_stages(spec, len(busy_s), pipe.split if pipe else None)
    estimated, n_layers = unit_costs(spec), spec.model.n_layers
    measured: list[float] = []
    for plan, busy in zip(plans, busy_s):
        units = ([0] if plan.has_embedding else []) + [b + 1 for b in plan.blocks] + \
                ([n_layers + 1] if plan.has_head else [])
        total = sum(estimated[u] for u in units)
        measured += [busy * estimated[u] / total for u in units]
    sizes = balanced_split(measured, len(busy_s))
    blocks = [*sizes]
    blocks[0] -= 1  # the embedding
    blocks[-1] -= 1  # the head
    return None if blocks == [len(p.blocks) for p in plans] else blocks
