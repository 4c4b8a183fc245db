"""bench/long_context.py on a tiny configuration: the table's columns, and the relations the measured peaks
must satisfy, above all the one cp is for: a long sequence split over cp ranks peaks lower per rank (ring
attention computes a tile of query rows at a time; it once kept whole [heads, S/cp, S/cp] score blocks and
cp2 peaked above cp1)."""

from __future__ import annotations

import pytest

from bench.long_context import HEAD, measure, rows

TINY = {"d_model": 32, "n_layers": 1, "n_heads": 4}


@pytest.fixture(scope="module")
def results():
    # cp1 and cp2 at 128 and 512 tokens, 2 timed steps at 512 (a few seconds)
    return measure([1, 2], budget_mib=1e6, max_seq=512, seq=512, steps=2, width=TINY, start=128)


def test_table_columns_and_rows(results, capsys):
    from bench.long_context import print_tables

    print_tables(results, 1e6, 512)
    out = capsys.readouterr().out
    header = out.splitlines()[1]
    assert [c.strip() for c in header.strip("|").split("|")] == list(HEAD)
    assert "host-limited" in out
    table = rows(results, 1e6, 512)
    assert [r["cp"] for r in table] == [1, 2]
    assert table[0]["peak_ratio"] == 1.0 and table[0]["tokens_per_s_ratio"] == 1.0
    assert all(r["tokens_per_s"] > 0 for r in table)
    assert [r["rank_tokens"] for r in table] == [512, 256]  # each cp rank holds S / cp tokens


def test_peaks_grow_with_the_sequence_and_state_is_the_same_under_cp(results):
    for res in results.values():
        sweep = res["sweep"]
        assert sweep[128]["peak"] < sweep[256]["peak"] < sweep[512]["peak"]
    assert results[1]["sweep"][512]["state"] == results[2]["sweep"][512]["state"]  # cp shards no parameter


def test_cp2_peaks_below_cp1_on_a_short_sequence(results):
    assert results[2]["sweep"][128]["act"] < results[1]["sweep"][128]["act"]
    assert results[2]["sweep"][128]["peak"] < results[1]["sweep"][128]["peak"]


def test_cp2_activation_peak_is_at_most_three_quarters_of_cp1_on_a_long_sequence(results):
    assert results[2]["sweep"][512]["act"] <= 0.75 * results[1]["sweep"][512]["act"]
    assert results[2]["sweep"][512]["peak"] < results[1]["sweep"][512]["peak"]
