"""Group commit on SQLite and PostgreSQL: concurrent writes share transactions, and each caller
still gets its own outcome (its result after commit, its refusal, its database error)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import event, func, select
from sqlalchemy.exc import IntegrityError

from service import quotas
from service.db import repository as repo
from service.db import tenants as tenant_repo
from service.db.group_commit import GroupCommit
from service.db.models import Job, Tenant
from tests.helpers import spec_of


@pytest.fixture
def tenant_id(sessions):
    with sessions.begin() as s:
        tenant, _ = tenant_repo.create_tenant(s, "acme")
        return tenant.id


def _insert(tenant_id: str, key: str):
    def write(s):
        job = repo.create_job(s, tenant_id, spec_of(), 0, "sha", key, max_open_jobs=None)
        return job.id
    return write


def _hold(writer: GroupCommit) -> threading.Event:
    """Keep the writer inside a first write until the returned event is set, so that everything
    submitted meanwhile queues up for one next batch."""
    entered, gate = threading.Event(), threading.Event()

    def hold(s):
        entered.set()
        return gate.wait(10)

    writer.submit(hold)
    assert entered.wait(10)
    return gate


def _commits(sessions) -> list[int]:
    count = [0]
    event.listen(sessions.engine, "commit", lambda conn: count.__setitem__(0, count[0] + 1))
    return count


def test_concurrent_writes_share_transactions_and_each_is_answered_after_commit(sessions, tenant_id):
    commits = _commits(sessions)
    writer = GroupCommit(sessions)
    try:
        gate = _hold(writer)  # the next 40 queue up behind it
        futures = [writer.submit(_insert(tenant_id, f"k{i}")) for i in range(40)]
        gate.set()
        ids = [f.result(30) for f in futures]
    finally:
        writer.close()
    assert len(set(ids)) == 40
    with sessions() as s:  # every answered write is committed, each once
        assert s.scalar(select(func.count()).select_from(Job).where(Job.id.in_(ids))) == 40
    assert commits[0] == 1, f"40 inserts took {commits[0]} transactions: they were not grouped"


def _refuse(tenant_id: str):
    def write(s):
        raise repo.QuotaExceeded("quota: over")
    return write


def _add_then_refuse(tenant_id: str):
    """Adds its rows, then raises (a bug, or a check placed too late)."""
    def write(s):
        job = repo.create_job(s, tenant_id, spec_of(), 0, "sha", "half", max_open_jobs=None)
        s.flush()  # even rows already sent to the database are taken back
        repo.add_event(s, job.id, "state", "never committed")
        raise repo.QuotaExceeded("quota: over, after writing")
    return write


@pytest.mark.parametrize("refusing", [_refuse, _add_then_refuse])
def test_a_refusal_is_its_callers_alone_and_the_batch_commits(sessions, tenant_id, refusing):
    """The refusing caller gets its exception, nothing of its write is committed (a write that
    wrote first sends its batch back to one write per transaction), and the others land."""
    writer = GroupCommit(sessions)
    try:
        gate = _hold(writer)
        before = writer.submit(_insert(tenant_id, "a"))
        refused = writer.submit(refusing(tenant_id))
        after = writer.submit(_insert(tenant_id, "b"))
        gate.set()
        with pytest.raises(repo.QuotaExceeded, match="over"):
            refused.result(30)
        ids = {before.result(30), after.result(30)}
    finally:
        writer.close()
    with sessions() as s:
        keys = s.scalars(select(Job.idempotency_key).where(Job.tenant_id == tenant_id)).all()
    assert sorted(keys) == ["a", "b"] and len(ids) == 2


def test_a_database_error_fails_only_its_own_write(sessions, tenant_id):
    """A unique key taken by someone else (another process) breaks the batch's flush: the batch is
    rolled back and retried one write per transaction, so only the duplicate fails."""
    with sessions.begin() as s:
        repo.create_job(s, tenant_id, spec_of(), 0, "sha", "taken", max_open_jobs=None)
    writer = GroupCommit(sessions)
    try:
        gate = _hold(writer)
        ok = [writer.submit(_insert(tenant_id, f"free{i}")) for i in range(3)]
        dup = writer.submit(_insert(tenant_id, "taken"))
        ok.append(writer.submit(_insert(tenant_id, "free3")))
        gate.set()
        with pytest.raises(IntegrityError):
            dup.result(30)
        ids = [f.result(30) for f in ok]
    finally:
        writer.close()
    with sessions() as s:
        keys = s.scalars(select(Job.idempotency_key).where(Job.tenant_id == tenant_id)).all()
    assert sorted(keys) == ["free0", "free1", "free2", "free3", "taken"] and len(set(ids)) == 4


def test_writes_from_many_threads_land_exactly_once(sessions, tenant_id):
    writer = GroupCommit(sessions)
    try:
        with ThreadPoolExecutor(16) as pool:
            ids = list(pool.map(lambda i: writer.submit(_insert(tenant_id, f"t{i}")).result(60), range(200)))
    finally:
        writer.close()
    with sessions() as s:
        rows = s.execute(select(Job.idempotency_key, func.count()).where(Job.tenant_id == tenant_id)
                         .group_by(Job.idempotency_key)).all()
    assert len(set(ids)) == 200 and len(rows) == 200 and all(n == 1 for _, n in rows)


def test_a_batch_takes_its_row_locks_in_one_order(sessions):
    """Writes run sorted by lock_order (FIFO within a key), whatever order they came in, so two
    replicas' batches that lock the same tenants cannot deadlock each other."""
    writer = GroupCommit(sessions)
    ran: list[str] = []
    try:
        gate = _hold(writer)
        futures = [writer.submit(lambda s, tag=tag: ran.append(tag), lock_order=tag.split("-")[0])
                   for tag in ("t2-first", "t1-first", "t2-second", "t1-second")]
        gate.set()
        for f in futures:
            f.result(30)
    finally:
        writer.close()
    assert ran == ["t1-first", "t1-second", "t2-first", "t2-second"]


def test_a_batch_of_submits_is_prepared_in_a_few_statements(sessions):
    """With prepare=quotas.prepare_submits, a batch of 40 submits over 4 tenants locks the tenants,
    reads their usage and looks up its 40 idempotency keys in a fixed handful of statements (not
    two per tenant plus one per key), and every write still gets its own answer: a replayed key
    its old job, a quota its refusal, counted against the batch's own earlier inserts."""
    with sessions.begin() as s:
        tenants = [tenant_repo.create_tenant(s, f"t{i}")[0].id for i in range(4)]
        s.get(Tenant, tenants[3]).max_queued_jobs = 9  # its 10th queued job is refused
        old = {t: repo.create_job(s, t, spec_of(), 0, "sha", f"{t}-old", max_open_jobs=None).id for t in tenants}

    def submit(tenant_id: str, key: str):
        def write(s):
            if (existing := repo.find_by_idempotency_key(s, tenant_id, key)) is not None:
                return existing.id
            tenant, usage = quotas.locked_usage(s, tenant_id)
            quotas.check_submit(tenant, usage, 1)
            job = repo.create_job(s, tenant_id, spec_of(), 0, "sha", key, max_open_jobs=None)
            usage.add_queued(1)
            return job.id
        return write

    selects: list[str] = []
    writer = GroupCommit(sessions, prepare=quotas.prepare_submits)
    try:
        gate = _hold(writer)
        keys = [(tenants[i % 4], f"{tenants[i % 4]}-old" if i < 4 else f"k{i}") for i in range(40)]
        event.listen(sessions.engine, "before_cursor_execute",
                     lambda conn, cursor, sql, *a: selects.append(sql) if sql.lstrip().upper().startswith("SELECT") else None)
        futures = [writer.submit(submit(t, k), lock_order=t, hint=(t, k)) for t, k in keys]
        gate.set()
        outcomes = []
        for f in futures:
            try:
                outcomes.append(f.result(30))
            except repo.QuotaExceeded:
                outcomes.append("quota")
    finally:
        writer.close()
    assert outcomes[:4] == [old[t] for t in tenants]  # replays
    assert outcomes.count("quota") == 1 and outcomes[39] == "quota"  # tenants[3]'s 10th queued job
    assert len(selects) <= 4, selects  # lock, usage, keys, the replayed jobs
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(Job)) == 4 + 35
