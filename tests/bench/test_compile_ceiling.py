"""bench/compile_ceiling.py: the share of an eager step in GEMM and attention kernels is read from the
profiler and bounds what compiling the blocks could gain; a model with no matrix product has no floor."""

from __future__ import annotations

import math

from bench.compile import spec_for
from bench.compile_ceiling import ceiling, gemm_share


def test_the_gpt_step_is_mostly_gemm_so_its_ceiling_is_finite_and_above_one():
    share = gemm_share(spec_for("gpt", 10, 1, False), warmup=2, steps=3)
    assert 0.3 < share < 1.0, share  # a 4 x d128 block step: matrix products dominate
    assert 1.0 < ceiling(share) < 3.4


def test_no_floor_means_no_ceiling():
    assert ceiling(0.0) == math.inf and ceiling(0.5) == 2.0
