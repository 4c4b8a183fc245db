"""What a stored metric point keeps for the console: each rank's step and compute time (jobs up to 256
ranks, also for a step the supervisor's buffer thinned) and a pipeline step's per-stage blocks."""

from __future__ import annotations

import pickle

from service.db.repository import STAGE_POINT_FIELDS, _extra_of
from service.rank_times import MAX_RANKS_IN_POINTS
from service.supervisor.record_buffer import RecordBuffer


def _step(step: int, world: int, slow_rank: int = 1) -> dict:
    ranks = [{"rank": r, "step_time_s": 0.25, "compute_time_s": 0.5 if r == slow_rank else 0.125}
             for r in range(world)]
    return {"type": "step", "step": step, "loss": 1.0, "ranks": ranks}


def test_rank_times_survive_the_buffer_thinning_and_reach_the_point():
    buffer = RecordBuffer()
    for step in (1, 2):
        buffer.push(_step(step, 4))
    older, newest = [r for r in buffer.drain(0) if r["type"] == "step"]
    assert "ranks" not in older and "ranks" in newest
    # The thinned step crosses to the control plane (Ray pickles it) and is stored like the newest one.
    for record in (pickle.loads(pickle.dumps(older)), newest):
        extra = _extra_of(record)
        assert extra is not None
        assert extra["rank_compute_time_s"] == [0.125, 0.5, 0.125, 0.125]
        assert extra["rank_step_time_s"] == [0.25] * 4


def test_past_the_rank_limit_no_per_rank_columns_are_kept():
    buffer = RecordBuffer()
    for step in (1, 2):
        buffer.push(_step(step, MAX_RANKS_IN_POINTS + 1))
    older, newest = [r for r in buffer.drain(0) if r["type"] == "step"]
    assert "rank_step_time_s" not in older
    for record in (older, newest):
        assert "rank_step_time_s" not in (_extra_of(record) or {})
    assert _extra_of(_step(3, MAX_RANKS_IN_POINTS))["rank_step_time_s"] == [0.25] * MAX_RANKS_IN_POINTS


def test_a_pipeline_point_keeps_each_stages_blocks_only():
    stage = {"stage": 0, "busy_s": 1.0, "forward_s": 0.4, "backward_s": 0.5, "weight_grad_s": 0.1, "comm_s": 0.05,
             "idle_s": 0.2, "other_s": 0.0, "wall_s": 1.25, "bubble_fraction": 0.16,
             "bubble_fraction_theoretical": 0.2, "activation_bytes_peak": 10, "activation_microbatches_peak": 2}
    extra = _extra_of({"step": 1, "stages": [stage, {**stage, "stage": 1}]})
    assert extra is not None and [s["stage"] for s in extra["stages"]] == [0, 1]
    assert set(extra["stages"][0]) == set(STAGE_POINT_FIELDS) and extra["stages"][0]["forward_s"] == 0.4
