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

from dataclasses import dataclass

import numpy as np

from workers.spec import StragglerSpec


@dataclass(frozen=True)
class StragglerChange:
    rank: int
    slow: bool  # True: became a straggler; False: recovered
    score: float
    step: int


class StragglerDetector:
    """Every rank's scores over the window in one ring (window x ranks): a step costs a few array
    operations, not a median per rank in Python (4,096 ranks: ~1 ms instead of ~25)."""

    def __init__(self, world_size: int, config: StragglerSpec):
        self.config = config
        self._ring = np.ones((config.window, world_size))
        self._filled = self._next = 0
        self.slow: set[int] = set()
        self.latest: list[float] | None = None  # each rank's score after the last step (None before one)

    def scores(self) -> dict[int, float]:
        return dict(enumerate(self.latest)) if self.latest is not None else {}

    def observe(self, step: int, compute_times: list[float], samples: list[int] | None = None) -> list[StragglerChange]:
        """Feed one step's per-rank compute times (per sample when `samples` is given)."""
        if len(compute_times) < 2:
            return []
        per_unit = np.asarray(compute_times, dtype=float)
        if samples:
            per_unit = per_unit / np.asarray(samples, dtype=float)
        median = np.partition(per_unit, (len(per_unit) - 1) // 2)[(len(per_unit) - 1) // 2]  # the lower median
        score = np.divide(median, per_unit, out=np.ones_like(per_unit), where=per_unit > 0)
        self._ring[self._next] = score
        self._next = (self._next + 1) % self.config.window
        self._filled = min(self._filled + 1, self.config.window)
        # The median over the window: one descheduled step on a busy host is not a trend.
        medians = np.median(self._ring[: self._filled], axis=0)
        self.latest = medians.tolist()
        if self._filled < self.config.window:
            return []
        became = set(np.flatnonzero(medians < self.config.threshold).tolist()) - self.slow
        recovered = {r for r in self.slow if medians[r] > self.config.recover}
        self.slow = (self.slow | became) - recovered
        return [StragglerChange(r, r in became, float(medians[r]), step) for r in sorted(became | recovered)]


class StragglerWatch:
    """The detector of one worker group, fed the job-level step records, plus each rank's
    per-sample compute time over the window (what the rebalance policy splits by)."""

    def __init__(self, world_size: int, config: StragglerSpec):
        self.world_size, self.config = world_size, config
        self.reset(0)

    def reset(self, from_step: int) -> None:
        """Judge every rank afresh from `from_step` (after a live rebalance: the old split's steps do not count)."""
        self.detector = StragglerDetector(self.world_size, self.config)
        self._per_sample = np.zeros((self.config.window, self.world_size))  # a ring, as the detector's
        self._filled = self._next = 0
        self.judge_from_step = from_step

    def observe(self, record: dict) -> list[StragglerChange]:
        """Score one job-level step record (writes `straggler_score` into its rank entries)."""
        if self.config.policy == "off" or record["step"] <= self.judge_from_step:
            return []
        ranks = record["ranks"]
        compute = [r["compute_time_s"] for r in ranks]
        changes = self.detector.observe(record["step"], compute)
        scores = self.detector.latest
        for r in ranks:
            r["straggler_score"] = scores[r["rank"]] if scores is not None and r["rank"] < len(scores) else None
        if len(ranks) == self.world_size:
            self._per_sample[self._next] = np.asarray(compute) / np.maximum([r["samples"] for r in ranks], 1)
            self._next = (self._next + 1) % self.config.window
            self._filled = min(self._filled + 1, self.config.window)
        return changes

    def per_sample_medians(self) -> tuple[float, ...]:
        return tuple(np.median(self._per_sample[: self._filled], axis=0).tolist()) if self._filled else ()
