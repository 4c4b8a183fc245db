"""The step aggregator when ranks leave and join a running attempt (the parameter server's async trainers,
issue 50): steps wait no more for a lost rank, and wait for a joined one only from the next new step."""

from __future__ import annotations

from service.supervisor.aggregate import StepAggregator


def record(step: int, rank: int) -> dict:
    return {"step": step, "rank": rank, "loss": 1.0 + rank, "step_time_s": 0.5, "compute_time_s": 0.4,
            "comm_time_s": 0.1, "samples": 4, "tokens": 0, "grad_norm": None, "lr": 1e-3, "comm_bytes": 0,
            "stage": None, "skipped": False, "ts": float(step)}


def test_a_lost_rank_releases_the_steps_waiting_for_it_and_a_joined_one_counts_from_the_next_step():
    agg = StepAggregator(3, 12)
    assert agg.add(record(1, 0)) is None and agg.add(record(1, 1)) is None
    assert agg.add(record(2, 0)) is None
    released = agg.drop_rank(2)  # step 1 had every other rank's record; step 2 still lacks rank 1's
    assert [r["step"] for r in released] == [1] and [x["rank"] for x in released[0]["ranks"]] == [0, 1]
    assert released[0]["samples_per_s"] == 8 / 0.5  # the samples the two ranks trained, not the global batch
    assert agg.add(record(2, 1))["step"] == 2
    agg.add_rank(2)  # joins: the steps after 2 wait for it too
    assert agg.add(record(3, 0)) is None and agg.add(record(3, 1)) is None
    assert agg.add(record(1, 2)) is None  # its record of a step told before it came: dropped
    joined = agg.add(record(3, 2))
    assert joined is not None and [x["rank"] for x in joined["ranks"]] == [0, 1, 2]
    assert joined["samples_per_s"] == 12 / 0.5
    assert agg.world_size == 3 and not agg.flush()
