"""FSDP with several micro-batches per rank (bench/fsdp_accumulate.py, 2 real gloo ranks, no Ray):
`parallel.fsdp_accumulate: sharded` (the default) keeps 1/K of the gradients between micro-batches, measured
at peak, `unsharded` keeps them whole; both train the same model."""

from __future__ import annotations

import pytest

from bench.fsdp_accumulate import RANKS, measure, table
from tests.helpers import tiny_spec
from workers.spec import SpecError
from workers.spec_loading import parse_spec


@pytest.mark.timeout(600)
def test_sharded_accumulation_keeps_a_shard_of_the_gradients_at_peak():
    res = measure(steps=3)
    sharded, unsharded = res["sharded"], res["unsharded"]
    whole = 4 * sharded["params"]  # fp32 gradient bytes of the whole model
    assert sharded["micro_batches"] > 1
    assert sharded["grads"] == pytest.approx(whole / RANKS, rel=0.05), table(res)
    assert unsharded["grads"] == pytest.approx(whole, rel=0.05), table(res)
    assert sharded["peak"] < unsharded["peak"], table(res)
    assert sharded["losses"] == pytest.approx(unsharded["losses"], rel=1e-5)  # another summation order only


def test_fsdp_accumulate_applies_to_zero_3_only():
    with pytest.raises(SpecError, match=r"parallel\.fsdp_accumulate applies to zero 3 only \(zero=1"):
        parse_spec(tiny_spec(**{"resources.workers": 2, "parallel.zero": 1,
                                "parallel.fsdp_accumulate": "unsharded"}))
