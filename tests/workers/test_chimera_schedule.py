"""Chimera's bidirectional schedule (workers/parallel/pipeline/chimera_schedule.py), without torch: the
paper's bubble, every operation once after what it consumes, and a message order both ends of every pair
can issue in (what makes the executed lists free of deadlock, under gloo's tags and NCCL's per-pair order)."""

from __future__ import annotations

import pytest

from workers.parallel.pipeline.bubble import theoretical_bubble
from workers.parallel.pipeline.chimera_schedule import (
    Op,
    Pipe,
    build,
    pair_order,
    paper_bubble,
    rank_of,
    simulated_bubble,
)

DEPTHS = [(2, 2), (2, 4), (4, 4), (4, 8), (6, 6), (6, 12), (8, 8), (8, 16)]


@pytest.mark.parametrize("pp,m", DEPTHS)
def test_the_schedule_reaches_the_papers_bubble_when_costs_are_equal(pp, m):
    assert simulated_bubble(pp, m, 1.0, 1.0) == pytest.approx(paper_bubble(pp, m))
    assert theoretical_bubble("chimera", pp, m) == paper_bubble(pp, m) == (pp - 2) / (2 * m + pp - 2)
    one_f_one_b = theoretical_bubble("1f1b", pp, m)
    assert simulated_bubble(pp, m, 1.0, 2.0) <= one_f_one_b + 1e-9  # never worse than 1F1B with B = 2F
    assert paper_bubble(pp, m) < one_f_one_b or pp == 2 and m > 2 and paper_bubble(pp, m) == 0.0


@pytest.mark.parametrize("pp,m", DEPTHS)
def test_every_operation_runs_once_on_its_rank_after_its_inputs(pp, m):
    plan = build(pp, m)
    every = [op for ops in plan.ops for op in ops]
    assert len(every) == len(set(every)) == 2 * pp * m
    for rank, ops in enumerate(plan.ops):
        assert all(rank_of(op, pp) == rank for op in ops)
        assert [plan.start[op] for op in ops] == sorted(plan.start[op] for op in ops)  # one at a time
        for op in ops:
            assert op.pipe == Pipe(op.micro % 2)  # even micro-batches down, odd ones up
            before = plan.needs(op)
            if before is not None:
                assert plan.finish[before] <= plan.start[op]
            if op.kind == "B":
                assert plan.finish[Op("F", op.pipe, op.stage, op.micro)] <= plan.start[op]


@pytest.mark.parametrize("pp,m", DEPTHS)
def test_both_ends_of_a_pair_can_issue_its_messages_in_the_agreed_order(pp, m):
    """Walking a rank's list as the executor does: sends go out when their producer ran, receives are
    posted no later than their consumer; the agreed order must never ask for a send not yet produced."""
    plan = build(pp, m)
    order = pair_order(plan)
    position = {(msg.producer, msg.dst): (pair, i) for pair, msgs in order.items() for i, msg in enumerate(msgs)}
    for rank, ops in enumerate(plan.ops):
        sent: set = set()
        for op in ops:
            needed = plan.needs(op)
            if needed is not None:  # every own send earlier in that pair's order has gone out already
                pair, i = position[(needed, rank)]
                assert all(msg.producer in sent for msg in order[pair][:i] if msg.src == rank), (rank, op)
            msg = plan.sends_after(op)
            if msg is not None:
                pair, i = position[(op, msg.dst)]
                assert all(m.producer in sent for m in order[pair][:i] if m.src == rank), (rank, op)
                sent.add(op)


def test_activation_memory_is_spread_evenly_over_the_ranks():
    """1F1B's first rank holds pp micro-batches and its last one; chimera's ranks hold about the same."""
    for pp, m in [(4, 8), (8, 16)]:
        peaks = build(pp, m).in_flight_peaks()
        assert max(peaks) - min(peaks) <= 2, peaks
        assert max(peaks) <= pp + 1
