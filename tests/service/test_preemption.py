"""Victim choice for preemption (service/preemption.py): pure, over rows."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from service.preemption import Row, Shortfall, choose_victims

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def row(id, priority, minute=0, tenant="a", state="RUNNING", workers=2, cpus=2.0, gpus=0.0, checkpoints=True):
    return Row(id, tenant, priority, T0 + timedelta(minutes=minute), state, workers, cpus, gpus, checkpoints)


HEAD = row("head", 5, minute=10, state="QUEUED")


def ids(rows):
    return [r.id for r in rows]


def test_lowest_priority_then_newest_first_and_only_as_many_as_needed():
    running = [row("p1-old", 1, 0), row("p0", 0, 1), row("p1-new", 1, 2), row("p4", 4, 3)]
    assert ids(choose_victims(HEAD, running, Shortfall(workers=2))) == ["p0"]
    assert ids(choose_victims(HEAD, running, Shortfall(workers=3))) == ["p0", "p1-new"]
    assert ids(choose_victims(HEAD, running, Shortfall(cpus=5.0))) == ["p0", "p1-new", "p1-old"]


def test_never_another_tenant_equal_priority_a_job_not_running_or_one_without_checkpoints():
    running = [row("other", 0, tenant="b"), row("equal", 5), row("higher", 9), row("starting", 0, state="STARTING"),
               row("recovering", 0, state="RECOVERING"), row("no-checkpoints", 0, checkpoints=False)]
    assert choose_victims(HEAD, running, Shortfall(workers=1)) == []


def test_nothing_when_the_victims_would_not_free_enough_or_nothing_is_lacking():
    running = [row("p0", 0, workers=1, cpus=1.0), row("p1", 1, workers=1, cpus=1.0)]
    assert choose_victims(HEAD, running, Shortfall(workers=3)) == []  # all of them would not do: keep running
    assert choose_victims(HEAD, running, Shortfall(gpus=1.0)) == []  # they hold no GPU
    assert choose_victims(HEAD, running, Shortfall()) == []
    assert ids(choose_victims(HEAD, running, Shortfall(workers=2, cpus=1.5))) == ["p0", "p1"]
