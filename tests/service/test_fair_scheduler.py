"""The scheduler on SQLite and PostgreSQL against a fake cluster port: a quota-blocked backlog larger
than any window does not hold back another tenant, the queue index follows submits, cancels and
requeues without reloading, and a job that waited reserve_after_s gets its reservation."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import select, update

from service.db import repository as repo
from service.db import tenants as tenant_repo
from service.db.models import Job, utcnow
from service.lifecycle import JobState
from service.scheduler import Scheduler
from service.settings import Settings
from tests.helpers import spec_of

ONE = spec_of()  # 1 worker, 1 CPU
FOUR = spec_of(**{"resources.workers": 4, "parallel.dp": 4})


class _Supervisor:
    class start:  # noqa: N801 - shaped like an actor method
        @staticmethod
        def remote(*args):
            return None


class FakeCluster:
    """The cluster port with `cpus` free: every admitted job's group counts as not created yet, so
    the scheduler takes its CPUs off what is free (its reserved-but-not-held accounting)."""

    def __init__(self, cpus: float):
        self.cpus = cpus
        self.supervisors: list[str] = []

    def available_resources(self) -> dict[str, float]:
        return {"CPU": self.cpus, "GPU": 0.0}

    def created_group_owners(self) -> set:
        return set()

    def create_supervisor(self, name: str):
        self.supervisors.append(name)
        return _Supervisor()


def scheduler(sessions, tmp_path, cluster: FakeCluster, **kw) -> Scheduler:
    size = {"CPU": 64.0, "GPU": 0.0}
    return Scheduler(sessions, Settings(home=tmp_path, **kw.pop("settings", {})), cluster=cluster,
                     capacity=lambda: (size, size), **kw)


def submit(s, tenant_id: str, spec=ONE, priority: int = 0) -> str:
    return repo.create_job(s, tenant_id, spec, priority, "sha", None, max_open_jobs=None).id


def state_of(sessions, job_id: str) -> str:
    with sessions() as s:
        return repo.get_job(s, job_id).state


def test_a_quota_blocked_backlog_of_1500_does_not_hold_back_another_tenant(sessions, tmp_path):
    with sessions.begin() as s:
        a = tenant_repo.ensure_tenant(s, "a", max_workers=4, quota_mode="queue")
        b = tenant_repo.ensure_tenant(s, "b")
        running = repo.create_job(s, a.id, FOUR, 0, "sha", None, max_open_jobs=None)
        repo.transition(s, running, JobState.STARTING, "admitted")  # a holds its 4 workers
        blocked = [submit(s, a.id, priority=5) for _ in range(1500)]  # older and of higher priority
    with sessions.begin() as s:
        other = submit(s, b.id)
    sched = scheduler(sessions, tmp_path, FakeCluster(cpus=100.0))
    assert sched.tick() == [other]
    assert state_of(sessions, blocked[0]) == JobState.QUEUED
    assert len(sched.feed.index) == 1500 and sched.feed.full_reads == 1


def test_the_index_follows_submits_cancels_and_requeues_without_reloading(sessions, tmp_path):
    with sessions.begin() as s:
        t = tenant_repo.ensure_tenant(s, "t")
        first = submit(s, t.id, FOUR)
    cluster = FakeCluster(cpus=0.0)
    sched = scheduler(sessions, tmp_path, cluster)
    sched.feed.overlap_s = 0.0  # only what changed after the last read is found: nothing by luck
    assert sched.tick() == [] and first in sched.feed.index  # the one full read
    with sessions.begin() as s:
        later = submit(s, t.id)
    cluster.cpus = 1.0
    assert sched.tick() == [later]  # backfilled past `first`, found by a read of what changed
    assert first in sched.feed.index and later not in sched.feed.index
    with sessions.begin() as s:
        repo.request_cancel(s, repo.get_job(s, first))
    assert sched.tick() == []
    assert first not in sched.feed.index  # cancelled: dropped
    # A preempted job is requeued (queued_at stamped again) and found by the next read of changes.
    with sessions.begin() as s:
        job = repo.get_job(s, later)
        repo.transition(s, job, JobState.RUNNING, "running")
        repo.transition(s, job, JobState.QUEUED, "preempted")
    cluster.cpus = 0.0
    sched.tick()
    assert later in sched.feed.index
    assert sched.feed.full_reads == 1 and sched.feed.change_reads == 3


def test_the_periodic_full_read_runs_beside_the_ticks_and_finds_what_a_window_missed(sessions, tmp_path):
    with sessions.begin() as s:
        t = tenant_repo.ensure_tenant(s, "t")
        first = submit(s, t.id)
    cluster = FakeCluster(cpus=0.0)
    sched = scheduler(sessions, tmp_path, cluster, resync_s=0.0)
    sched.feed.overlap_s = 0.0
    assert sched.tick() == [] and sched.feed.full_reads == 1  # the first full read is the tick's own
    with sessions.begin() as s:  # a job whose stamp no window covers (a replica's clock far behind)
        missed = submit(s, t.id)
        s.execute(update(Job).where(Job.id == missed).values(queued_at=repo.utcnow().replace(year=2000)))
    cluster.cpus = 1.0
    assert sched.tick() == [first]  # admitted while the full read began on its own thread
    assert missed not in sched.feed.index and sched.feed.full_reads == 1
    resync = sched.feed._resync
    assert resync is not None and resync.done.wait(10)
    cluster.cpus = 0.0
    sched.tick()  # its index swapped in: the missed job found, the admitted one not brought back
    assert missed in sched.feed.index and first not in sched.feed.index and sched.feed.full_reads == 2


def test_a_job_that_waited_reserve_after_s_is_not_overtaken_and_starts(sessions, tmp_path):
    with sessions.begin() as s:
        a, b = tenant_repo.ensure_tenant(s, "a"), tenant_repo.ensure_tenant(s, "b")
        big = submit(s, a.id, FOUR)
        smalls = [submit(s, b.id) for _ in range(3)]
    offset = [0.0]
    cluster = FakeCluster(cpus=2.0)
    sched = scheduler(sessions, tmp_path, cluster, settings={"reserve_after_s": 60.0},
                      clock=lambda: time.time() + offset[0])
    assert sched.tick() == smalls[:2]  # the big job has not waited 60 s: two small ones backfill
    offset[0] = 120.0
    with sessions.begin() as s:  # the two ended: their CPUs are free again
        s.execute(update(Job).where(Job.id.in_(smalls[:2])).values(state=JobState.SUCCEEDED))
    assert sched.tick() == []  # 2 CPUs free, held for the big job: the third small one waits
    with sessions() as s:
        [event] = [e for e in repo.list_events(s, big, 0, 10) if e.kind == "reserved"]
    assert "waited 1" in event.message and sched.reserved_for == big
    cluster.cpus = 4.0
    assert sched.tick() == [big]
    assert sched.tick() == []  # the big job's 4 CPUs are taken (its group not created yet)
    cluster.cpus = 5.0
    assert sched.tick() == [smalls[2]]
    with sessions() as s:
        admitted = [e for e in repo.list_events(s, smalls[0], 0, 10) if e.state == JobState.STARTING]
    assert admitted[0].data["backfilled_ahead_of"] == big


def reserved_marks(sessions) -> dict[str, object]:
    with sessions() as s:
        return dict(s.execute(select(Job.id, Job.reserved_at).where(Job.reserved_at.is_not(None))).all())


def test_the_reservation_is_marked_once_and_a_new_leader_clears_a_stale_mark(sessions, tmp_path):
    with sessions.begin() as s:
        a, b = tenant_repo.ensure_tenant(s, "a"), tenant_repo.ensure_tenant(s, "b")
        big = submit(s, a.id, FOUR)
        other_big = submit(s, b.id, FOUR)
        s.execute(update(Job).where(Job.id == other_big).values(reserved_at=utcnow()))  # a former leader's
    cluster = FakeCluster(cpus=2.0)
    sched = scheduler(sessions, tmp_path, cluster, settings={"reserve_after_s": 0.0})
    assert sched.tick() == [] and sched.reserved_for == big
    marks = reserved_marks(sessions)
    assert list(marks) == [big]  # the stale mark is gone, the new one written
    sched.tick()
    assert reserved_marks(sessions) == marks  # not rewritten while the reservation holds
    cluster.cpus = 4.0
    assert sched.tick() == [big]
    sched.tick()  # the reservation moves to the next big job: the started one's mark is cleared
    assert list(reserved_marks(sessions)) == [other_big] and sched.reserved_for == other_big


def test_a_negative_reserve_after_s_is_refused_at_start(monkeypatch):
    from service.settings import InvalidSettings, get_settings

    get_settings.cache_clear()
    monkeypatch.setenv("TRAINYARD_RESERVE_AFTER_S", "-1")
    try:
        with pytest.raises(InvalidSettings, match=r"TRAINYARD_RESERVE_AFTER_S: Input should be greater than or equal"):
            get_settings()
        monkeypatch.setenv("TRAINYARD_RESERVE_AFTER_S", "0")
        get_settings.cache_clear()
        assert get_settings().reserve_after_s == 0.0
    finally:
        get_settings.cache_clear()
