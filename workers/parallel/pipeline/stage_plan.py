"""Pipeline stage plans from unit costs: the balanced contiguous split, pinned splits, placement of
stages on ranks, and the re-split by measured cost. Pure arithmetic on a list of unit costs
([embedding, block 0..L-1, head]), no torch: the supervisor plans with it from costs a child
process estimated (unit_costs_apart.py); the ranks with costs they estimated themselves (split.py)."""

from __future__ import annotations

from dataclasses import dataclass


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


def plans_from_costs(costs: list[float], n_stages: int, split: list[int] | None = None) -> list[StagePlan]:
    """The stage plans: `split` pins blocks per stage; otherwise balanced by the unit costs."""
    n_layers = len(costs) - 2
    if split is not None and sum(split) != n_layers:  # a user module's blocks are counted only now
        raise ValueError(f"parallel.pipeline.split {list(split)} must sum to the model's {n_layers} blocks")
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


def stage_to_rank(stage: int, pp: int, v_shape: bool) -> int:
    """Looped placement puts stage s on rank s % pp; V placement goes 0..pp-1 then back pp-1..0."""
    if not v_shape:
        return stage % pp
    return stage if stage < pp else 2 * pp - 1 - stage


def resplit_by_measured(costs: list[float], busy_s: list[float], threshold: float,
                        split: list[int] | None) -> list[int] | None:
    """Blocks per stage re-balanced by *measured* cost, or None when stages are within `threshold`.

    Each stage's measured busy time is shared among its units in proportion to their estimated
    cost; the balanced split of those measured unit costs is the new split. Single-stage schedules
    only (one stage per rank, so a rank's busy time is its stage's).
    """
    if min(busy_s) <= 0 or max(busy_s) / min(busy_s) - 1.0 <= threshold:
        return None
    plans = plans_from_costs(costs, len(busy_s), split)
    n_layers = len(costs) - 2
    measured: list[float] = []
    for plan, busy in zip(plans, busy_s):
        units = ([0] if plan.has_embedding else []) + [b + 1 for b in plan.blocks] + \
                ([n_layers + 1] if plan.has_head else [])
        total = sum(costs[u] for u in units)
        measured += [busy * costs[u] / total for u in units]
    blocks = balanced_split(measured, len(busy_s))
    blocks[0] -= 1  # the embedding
    blocks[-1] -= 1  # the head
    return None if blocks == [len(p.blocks) for p in plans] else blocks
