"""bench/median_interval.py: the order-statistic interval of a median and the verdict against a target."""

from __future__ import annotations

import math
import random

import pytest

from bench.median_interval import Verdict, median_interval


def test_the_interval_is_the_order_statistics_the_binomial_gives():
    # n = 8: [x_(2), x_(7)] covers with 1 - 2 * 9/256 = 0.93; [x_(3), x_(6)] only 0.71 (< 0.9)
    interval = median_interval([0.97, 0.95, 1.01, 0.99, 0.96, 1.03, 0.98, 1.00])
    assert (interval.low, interval.high) == (0.96, 1.01)
    assert math.isclose(interval.coverage, 1 - 2 * 9 / 256)
    assert interval.median == pytest.approx(0.985)


def test_too_few_values_give_the_full_range_and_say_how_little_it_covers():
    interval = median_interval([0.99, 0.97, 1.02])
    assert (interval.low, interval.high) == (0.97, 1.02)
    assert interval.coverage == pytest.approx(0.75)
    # wholly below the target, but 3 pairs cannot cover 90%, nor can one
    assert median_interval([0.90, 0.91, 0.92]).verdict(0.98) is Verdict.UNDECIDED
    assert median_interval([0.90]).verdict(0.98) is Verdict.UNDECIDED


def test_the_verdict_needs_the_whole_interval_on_one_side():
    rng = random.Random(0)
    near = [0.985 + rng.uniform(-0.03, 0.03) for _ in range(8)]
    assert median_interval(near).verdict(0.98) is Verdict.UNDECIDED
    assert median_interval([1.0 + i / 1000 for i in range(8)]).verdict(0.98) is Verdict.MET
    assert median_interval([0.95 + i / 1000 for i in range(8)]).verdict(0.98) is Verdict.MISSED


def test_coverage_holds_on_skewed_samples():
    rng = random.Random(1)
    hits = 0
    for _ in range(2000):
        interval = median_interval([rng.expovariate(1.0) for _ in range(15)])
        hits += interval.low <= math.log(2) <= interval.high  # the exponential's true median
    assert hits / 2000 >= 0.9 - 0.02, hits


def test_no_values_is_an_error():
    with pytest.raises(ValueError, match="at least one"):
        median_interval([])
