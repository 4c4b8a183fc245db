"""The soak's verdict on a slow-rank fault whose detection window a restart cut short
(bench/soak/collect.window_cut_short): excused only when no attempt on the degraded node ran a
full window of steps, counting the steps a lost supervisor's telemetry gap covers."""

from __future__ import annotations

from datetime import datetime, timezone

from bench.soak.collect import window_cut_short
from workers.training.faults import SlowRun

FIRED = 1_000.0
RESTART = FIRED + 6.4
FIRST = SlowRun(0, "node-a", True, 7, FIRED)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat()


def _points(first: int, last: int, t0: float) -> list[dict]:
    return [{"step": s, "ts": t0 + (s - first)} for s in range(first, last + 1)]


def _restart(at: float = RESTART) -> dict:
    return {"kind": "restart", "ts": _iso(at), "data": {}}


def _after_restart(node: str, last_step: int) -> tuple[list[dict], list[SlowRun]]:
    """Steps 7..12 before the restart; the rank resumes from step 5 on `node` and trains to last_step."""
    points = _points(7, 12, FIRED) + _points(5, last_step, RESTART + 3.0)
    return points, [FIRST, SlowRun(0, node, node == "node-a", 7, RESTART + 5.0)]


def test_a_rank_moved_off_the_degraded_node_before_a_full_window_is_excused():
    points, runs = _after_restart("node-b", 30)
    cut = window_cut_short([_restart()], points, at_step=7, fired_at=FIRED, runs=runs, window=8)
    assert cut is not None
    when, why = cut
    assert when == RESTART
    assert "6.4 s after the fault" in why and "(6 steps on the degraded node, 24 steps off the degraded node)" in why


def test_a_rank_restarted_on_the_degraded_node_owes_an_event_once_it_ran_a_window():
    points, runs = _after_restart("node-a", 30)
    assert window_cut_short([_restart()], points, at_step=7, fired_at=FIRED, runs=runs, window=8) is None
    points, runs = _after_restart("node-a", 13)  # the job ended 7 slow steps after the restart: none due
    assert window_cut_short([_restart()], points, at_step=7, fired_at=FIRED, runs=runs, window=8) is not None
    # No record of where the rank ran after the restart: it is taken to have stayed.
    assert window_cut_short([_restart()], _after_restart("node-b", 30)[0], at_step=7, fired_at=FIRED,
                            runs=[FIRST], window=8) is None


def test_steps_lost_with_a_killed_supervisor_count_towards_the_window():
    gap = {"kind": "telemetry_gap", "ts": _iso(RESTART), "data": {"from_step": 13, "to_step": 14}}
    points, runs = _after_restart("node-b", 30)
    assert window_cut_short([gap, _restart()], points, at_step=7, fired_at=FIRED, runs=runs, window=8) is None


def test_a_restart_after_a_full_window_excuses_nothing():
    runs = [FIRST, SlowRun(0, "node-b", False, 7, FIRED + 25.0)]
    assert window_cut_short([_restart(FIRED + 20.0)], _points(7, 20, FIRED), at_step=7, fired_at=FIRED,
                            runs=runs, window=8) is None


def test_no_restart_or_one_before_the_fault_excuses_nothing():
    assert window_cut_short([], _points(7, 9, FIRED), at_step=7, fired_at=FIRED, runs=[FIRST], window=8) is None
    before = [_restart(FIRED - 30.0), {"kind": "state", "ts": _iso(FIRED + 2.0), "state": "RUNNING", "data": {}}]
    assert window_cut_short(before, _points(7, 9, FIRED), at_step=7, fired_at=FIRED, runs=[FIRST], window=8) is None
