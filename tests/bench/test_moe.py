"""bench/moe.py on a tiny configuration (ep 1 and 2 on 2 ranks): the table's columns and the measured
relations: no all-to-all without ep, the product's all_to_all_bytes (forward + the backward's rows) equals
what this rank handed to all_to_all_single, the routing (so the per-expert imbalance) of the first step is
the same under ep, and a rank holds less model state under ep2."""

from __future__ import annotations

import pytest

from bench.moe import HEAD, measure, rows


@pytest.fixture(scope="module")
def results():
    return measure([1, 2], workers=2, seq=32, global_batch=4, micro_batch=1, experts=4, top_k=2, steps=2)


def test_table_columns(results, capsys):
    from bench.moe import print_table

    print_table(results)
    out = capsys.readouterr().out
    assert [c.strip() for c in out.splitlines()[0].strip("|").split("|")] == list(HEAD)
    assert "host-limited" in out
    table = rows(results)
    assert [r["ep"] for r in table] == [1, 2]
    assert table[0]["state_ratio"] == 1.0 and all(r["tokens_per_s"] > 0 for r in table)


def test_all_to_all_bytes(results):
    assert results[1]["a2a_bytes"] == 0 and results[1]["metered_bytes"] == 0
    assert results[2]["a2a_bytes"] > 0
    assert results[2]["a2a_matches_metered"], (results[2]["a2a_bytes"], results[2]["metered_bytes"])


def test_same_routing_and_less_state_under_ep(results):
    first = [results[ep]["imbalance_steps"][0][0] for ep in (1, 2)]
    assert first[0] == pytest.approx(first[1]), first  # same weights, same batch: same routing
    assert results[2]["state"] < results[1]["state"]
    assert results[2]["imbalance_owner"] >= 1.0 and results[1]["imbalance_owner"] == 1.0


def test_expert_replicas_agree_under_ep2(results):
    assert results[2]["expert_replicas_agree"]


def test_expert_replicas_agree_without_ep(results):  # DDP reduces whole experts like any parameter
    assert results[1]["expert_replicas_agree"]
