"""Straggler detection and the rebalance plan: pure functions of per-rank compute times.

Score of rank r at one step = (lower) median compute time over ranks / rank r's
compute time (1.0 = typical, 0.33 = three times slower); the lower median, so that
with two ranks the slow one is compared with the fast one, not with their mean. Compute time excludes waiting
for peers, so a fast rank blocked on a slow one is not blamed. A rank is slow
once the median of its score over `window` steps is below `threshold`, and stops
being slow only above `recover` (hysteresis, so noise does not flap).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

from workers.spec import StragglerSpec


@dataclass(frozen=True)
class StragglerChange:
    rank: int
    slow: bool  # True: became a straggler; False: recovered
    score: float
    step: int


class StragglerDetector:
    def __init__(self, world_size: int, config: StragglerSpec):
        self.config = config
        self.history = [deque(maxlen=config.window) for _ in range(world_size)]
        self.slow: set[int] = set()

    def scores(self) -> dict[int, float]:
        # The median over the window: one descheduled step on a busy host is not a trend.
        return {r: statistics.median(h) for r, h in enumerate(self.history) if h}

    def observe(self, step: int, compute_times: list[float], samples: list[int] | None = None) -> list[StragglerChange]:
        """Feed one step's per-rank compute times (per sample when `samples` is given)."""
        if len(compute_times) < 2:
            return []
        per_unit = [t / n for t, n in zip(compute_times, samples)] if samples else list(compute_times)
        median = statistics.median_low(per_unit)
        changes = []
        for rank, t in enumerate(per_unit):
            self.history[rank].append(median / t if t > 0 else 1.0)
            if len(self.history[rank]) < self.config.window:
                continue
            score = statistics.median(self.history[rank])
            if rank not in self.slow and score < self.config.threshold:
                self.slow.add(rank)
                changes.append(StragglerChange(rank, True, score, step))
            elif rank in self.slow and score > self.config.recover:
                self.slow.discard(rank)
                changes.append(StragglerChange(rank, False, score, step))
        return changes


def even_shares(global_batch: int, dp: int) -> list[int]:
    """The split every data-parallel job starts with (the spec makes dp divide the global batch)."""
    return [global_batch // dp] * dp


def rebalanced_shares(global_batch: int, per_sample_times: list[float]) -> list[int]:
    """Split the global batch in proportion to each rank's speed (every rank keeps >= 1 sample)."""
    speeds = [1.0 / t for t in per_sample_times]
    total = sum(speeds)
    exact = [global_batch * s / total for s in speeds]
    shares = [max(1, int(x)) for x in exact]
    # Hand out what rounding left to the ranks that lost the most.
    order = sorted(range(len(shares)), key=lambda r: exact[r] - shares[r], reverse=True)
    i = 0
    while sum(shares) < global_batch:
        shares[order[i % len(order)]] += 1
        i += 1
    while sum(shares) > global_batch:
        r = max(range(len(shares)), key=lambda k: shares[k] - exact[k])
        shares[r] -= 1
    return shares
