"""How sure a median of paired ratios is, and whether it clears a target.

Single pairs on a shared 2-core host spread several percent, so a median alone does not say
whether a target such as ">= 0.98" is met or just met this time. The interval here is the
distribution-free one for a median: the k-th smallest and k-th largest of n values cover the true
median with probability 1 - 2 * P(Binomial(n, 1/2) <= k - 1), whatever the spread's shape. It
takes the largest k that still gives the asked coverage, so more pairs give a narrower interval.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from enum import Enum


class Verdict(Enum):
    MET = "met"  # the whole interval is at or above the target
    MISSED = "missed"  # the whole interval is below it
    UNDECIDED = "undecided"  # the interval straddles it, or too few pairs cover the median as asked


@dataclass(frozen=True)
class MedianInterval:
    n: int
    median: float
    low: float
    high: float
    coverage: float  # the probability that [low, high] holds the true median
    asked: float  # the coverage wanted; fewer than 5 values cannot give 90%

    def verdict(self, target: float) -> Verdict:
        if self.coverage < self.asked:
            return Verdict.UNDECIDED
        if self.low >= target:
            return Verdict.MET
        if self.high < target:
            return Verdict.MISSED
        return Verdict.UNDECIDED


def _below(n: int, k: int) -> float:
    """P(Binomial(n, 1/2) <= k)."""
    return sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n


def median_interval(values: list[float], coverage: float = 0.9) -> MedianInterval:
    """The median of `values` and the narrowest order-statistic interval covering it with at least
    `coverage`; with too few values for that, the full range and the coverage it does give."""
    if not values:
        raise ValueError("median_interval needs at least one value")
    ordered = sorted(values)
    n = len(ordered)
    k = 1  # 1-based: [x_(k), x_(n-k+1)]
    while k + 1 <= (n + 1) // 2 and 1 - 2 * _below(n, k) >= coverage:
        k += 1
    return MedianInterval(n, statistics.median(ordered), ordered[k - 1], ordered[n - k], 1 - 2 * _below(n, k - 1),
                          coverage)
