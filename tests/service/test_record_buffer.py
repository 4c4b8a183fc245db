"""The supervisor's record buffer: only its newest step keeps the per-rank entries, so what waits for
a late drain does not grow by thousands of rank entries a step; nothing the database keeps is lost."""

from __future__ import annotations

from service.db.repository import _extra_of
from service.supervisor.record_buffer import RecordBuffer


def _step(step: int, measured: bool = False) -> dict:
    ranks = [{"rank": r, "compute_time_s": 0.1, "peak_memory_breakdown": {"params": r} if measured else None}
             for r in range(4096)]
    record = {"type": "step", "step": step, "loss": 1.0, "ranks": ranks}
    if measured:
        record["peak_memory_bytes_per_rank"] = [1000 + r for r in range(4096)]
    return record


def test_only_the_newest_step_keeps_its_ranks_and_a_measured_steps_breakdown_stays():
    buffer = RecordBuffer()
    buffer.push(_step(1, measured=True))
    buffer.push({"type": "event", "kind": "checkpoint"})
    buffer.push(_step(2))
    buffer.push(_step(3))
    records = buffer.drain(0)
    steps = [r for r in records if r["type"] == "step"]
    assert [("ranks" in r) for r in steps] == [False, False, True]
    assert len(steps[-1]["ranks"]) == 4096 and [r["seq"] for r in records] == [1, 2, 3, 4]
    extra = _extra_of(steps[0])  # what the database stores of the thinned, measured step
    assert extra is not None and extra["peak_memory_bytes_per_rank"][5] == 1005
    assert extra["peak_memory_breakdown_per_rank"][7] == {"params": 7}
    assert buffer.drain(4) == [] and buffer.seq == 4
