"""The leader lease and its fencing on SQLite and PostgreSQL, and the scheduler's SKIP LOCKED claim."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import func, select

from service.db import repository as repo
from service.db import tenants as tenant_repo
from service.db.models import JobEvent, LeaseRow
from service.leases import FencedSessions, LeaderLease, LeaseLost
from tests.helpers import spec_of


def test_one_holder_at_a_time_and_each_takeover_bumps_the_token(sessions):
    a = LeaderLease(sessions, ttl_s=1.0, holder="host-a:1:a")
    b = LeaderLease(sessions, ttl_s=1.0, holder="host-b:2:b")
    assert a.try_acquire() and a.token == 1
    assert not b.try_acquire() and b.current_holder == "host-a:1:a"
    assert a.try_acquire() and a.token == 1  # renewing keeps the token
    time.sleep(1.2)  # a stops renewing (paused, cut off, killed): its lease runs out
    assert not a.held()
    assert b.try_acquire() and b.token == 2
    with sessions() as s:
        row = s.scalar(select(LeaseRow))
        assert (row.holder, row.token) == ("host-b:2:b", 2)


def test_a_replica_that_lost_the_lease_writes_nothing(sessions):
    a = LeaderLease(sessions, ttl_s=1.0, holder="host-a:1:a")
    b = LeaderLease(sessions, ttl_s=1.0, holder="host-b:2:b")
    with sessions.begin() as s:
        tenant = tenant_repo.ensure_tenant(s, "t")
        job = repo.create_job(s, tenant.id, spec_of(), 0, "sha", None, max_open_jobs=None)
    assert a.try_acquire()
    fenced = FencedSessions(sessions, a)
    with fenced.begin() as s:  # the holder writes
        repo.add_event(s, job.id, "note", "by a")
    time.sleep(1.2)
    assert b.try_acquire()
    a._valid_until = time.monotonic() + 60  # a still believes it leads (e.g. it was paused): the token stops it
    with pytest.raises(LeaseLost):
        with fenced.begin() as s:
            repo.add_event(s, job.id, "note", "by a after losing the lease")
    assert not a.held()
    with sessions() as s:
        notes = s.scalar(select(func.count()).select_from(JobEvent).where(JobEvent.kind == "note"))
    assert notes == 1


def test_a_clean_stop_hands_the_lease_on_at_once(sessions):
    a = LeaderLease(sessions, ttl_s=30.0, holder="host-a:1:a")
    b = LeaderLease(sessions, ttl_s=30.0, holder="host-b:2:b")
    assert a.try_acquire() and not b.try_acquire()
    a.release()
    assert b.try_acquire() and b.token == 2


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)  # row locks; SQLite has one writer
def test_a_queued_row_locked_elsewhere_is_skipped_not_waited_for(sessions):
    from service.scheduler import Scheduler

    with sessions.begin() as s:
        tenant = tenant_repo.ensure_tenant(s, "t")
        job_id = repo.create_job(s, tenant.id, spec_of(), 0, "sha", None, max_open_jobs=None).id
    with sessions.begin() as holder:  # e.g. another scheduler's transaction mid-admission
        assert Scheduler._claim(holder, job_id) is not None
        started = time.monotonic()
        with sessions.begin() as other:
            assert Scheduler._claim(other, job_id) is None
        assert time.monotonic() - started < 2.0
    with sessions.begin() as s:
        assert Scheduler._claim(s, job_id) is not None  # released with the first transaction


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_on_sqlite_a_holder_that_died_on_this_host_is_replaced_at_once(sessions):
    import os
    import socket
    import subprocess
    import sys

    host = socket.gethostname()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert LeaderLease(sessions, ttl_s=60, holder=f"{host}:{gone.stdout.strip()}:old").try_acquire()
    restarted = LeaderLease(sessions, ttl_s=60)  # this process, e.g. a restart after a crash
    assert restarted.try_acquire() and restarted.token == 2
    # A holder with our pid but another name can only be an earlier process (PID 1 of a restarted container).
    again = LeaderLease(sessions, ttl_s=60, holder=f"{host}:{os.getpid()}:next")
    assert again.try_acquire() and again.token == 3
    # A live process on this host (our parent, say) keeps it until it expires.
    with sessions.begin() as s:
        s.scalar(select(LeaseRow)).holder = f"{host}:{os.getppid()}:live"
    assert not LeaderLease(sessions, ttl_s=60).try_acquire()
