"""Straggler detection: which ranks are slow, from per-rank compute times (what to do about
them is a policy: service/supervisor/policies/stragglers/).

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
        self.history: list[deque[float]] = [deque(maxlen=config.window) for _ in range(world_size)]
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


class StragglerWatch:
    """The detector of one worker group, fed the job-level step records, plus each rank's
    per-sample compute time over the window (what the rebalance policy splits by)."""

    def __init__(self, world_size: int, config: StragglerSpec):
        self.world_size, self.config = world_size, config
        self.reset(0)

    def reset(self, from_step: int) -> None:
        """Judge every rank afresh from `from_step` (after a live rebalance: the old split's steps do not count)."""
        self.detector = StragglerDetector(self.world_size, self.config)
        self.per_sample: list[deque[float]] = [deque(maxlen=self.config.window) for _ in range(self.world_size)]
        self.judge_from_step = from_step

    def observe(self, record: dict) -> list[StragglerChange]:
        """Score one job-level step record (writes `straggler_score` into its rank entries)."""
        if self.config.policy == "off" or record["step"] <= self.judge_from_step:
            return []
        ranks = record["ranks"]
        changes = self.detector.observe(record["step"], [r["compute_time_s"] for r in ranks])
        scores = self.detector.scores()
        for r in ranks:
            r["straggler_score"] = scores.get(r["rank"])
        for window, r in zip(self.per_sample, ranks):
            window.append(r["compute_time_s"] / max(r["samples"], 1))
        return changes

    def per_sample_medians(self) -> tuple[float, ...]:
        return tuple(statistics.median(w) for w in self.per_sample)
