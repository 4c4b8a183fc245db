"""The soak's verdict on a slow-rank fault whose detection window a restart cut short
(bench/soak/collect.window_cut_short): excused only when fewer than a window of steps ran first."""

from __future__ import annotations

from datetime import datetime, timezone

from bench.soak.collect import window_cut_short

FIRED = 1_000.0


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).isoformat()


def _points(first: int, last: int, t0: float) -> list[dict]:
    return [{"step": s, "ts": t0 + (s - first)} for s in range(first, last + 1)]


def test_a_restart_before_a_full_window_excuses_the_missing_event():
    events = [{"kind": "restart", "ts": _iso(FIRED + 6.4), "data": {}}]
    cut = window_cut_short(events, _points(7, 12, FIRED), at_step=7, fired_at=FIRED, window=8)
    assert cut is not None
    when, why = cut
    assert when == FIRED + 6.4
    assert "6.4 s after the fault" in why and "6 of the straggler window's 8 steps" in why


def test_a_restart_after_a_full_window_excuses_nothing():
    events = [{"kind": "restart", "ts": _iso(FIRED + 20.0), "data": {}}]
    assert window_cut_short(events, _points(7, 20, FIRED), at_step=7, fired_at=FIRED, window=8) is None


def test_no_restart_or_one_before_the_fault_excuses_nothing():
    assert window_cut_short([], _points(7, 9, FIRED), at_step=7, fired_at=FIRED, window=8) is None
    before = [{"kind": "restart", "ts": _iso(FIRED - 30.0), "data": {}},
              {"kind": "state", "ts": _iso(FIRED + 2.0), "state": "RUNNING", "data": {}}]
    assert window_cut_short(before, _points(7, 9, FIRED), at_step=7, fired_at=FIRED, window=8) is None
