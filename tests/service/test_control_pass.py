"""The reconciler's pass over many jobs: a constant number of SQL statements, whatever the number of
jobs; each record stored once when drained again; one job's bad drain loses no other job's; checkpoint
sizes listed on the store after the commit, a store that fails or hangs holding up no pass."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import func, select

from bench.control_pass import FakeCluster, FakeSupervisor, StatementCounter, running_jobs
from service.db.models import Checkpoint, Job, JobEvent, JobMetric
from service.live_metrics import LiveMetrics
from service.reconciler import Reconciler
from service.settings import Settings
from tests.service.test_reconciler_metrics import value
from workers.checkpointing import checkpoint_root, step_name
from workers.events import CheckpointEvent
from workers.storage import Storage

MAX_STATEMENTS = 8  # the read, the lock, the progress, the metrics (+ the lease check when fenced)


def _reconciler(sessions, tmp_path, cluster) -> Reconciler:
    return Reconciler(sessions, Settings(home=tmp_path), launcher=object(), metrics=LiveMetrics(), cluster=cluster)


def _count(sessions, model, **where) -> int:
    with sessions() as s:
        q = select(func.count()).select_from(model)
        for key, want in where.items():
            q = q.where(getattr(model, key) == want)
        return s.scalar(q) or 0


def _pass(reconciler: Reconciler, cluster: FakeCluster, counter: StatementCounter) -> int:
    for sup in cluster.supervisors.values():
        sup.train_step()
    counter.take()
    reconciler.tick()
    return counter.take()[0]


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)  # (SQLite: the ORM inserts events one by one)
def test_a_pass_costs_the_same_few_statements_for_20_jobs_as_for_200(sessions, tmp_path):
    cluster = FakeCluster()
    running_jobs(sessions, cluster, 20)
    reconciler = _reconciler(sessions, tmp_path, cluster)
    counter = StatementCounter(sessions.engine)
    small = [_pass(reconciler, cluster, counter) for _ in range(3)]
    running_jobs(sessions, cluster, 180)
    large = [_pass(reconciler, cluster, counter) for _ in range(3)]
    assert max(small + large) <= MAX_STATEMENTS, (small, large)
    assert large[1:] == small[1:]  # (the first pass after new jobs also reads their specs once)
    reconciler.tick()  # acknowledges the last records
    reconciler.drain_background()
    assert _count(sessions, JobMetric) == 20 * 6 + 180 * 3  # every step stored, once
    counter.take()
    reconciler.tick()
    assert counter.take()[0] == 1  # nothing new anywhere: the read of the active jobs, nothing else


def test_records_drained_again_are_stored_once_and_one_bad_drain_loses_no_other(sessions, tmp_path):
    cluster = FakeCluster()
    ids = running_jobs(sessions, cluster, 200)
    reconciler = _reconciler(sessions, tmp_path, cluster)
    sups = {sup.job_id: sup for sup in cluster.supervisors.values()}
    for sup in sups.values():
        sup.train_step()
        sup.train_step()
    # The control plane died after its commit, before its next drain acknowledged: the supervisors
    # return the same records again (ack 0).
    drains = {job_id: sups[job_id].drain.fn(0) for job_id in ids}
    reconciler.apply_many(drains)
    reconciler.apply_many({job_id: sups[job_id].drain.fn(0) for job_id in ids})
    assert _count(sessions, JobMetric) == 200 * 2
    # One job's drain is malformed: the pass's transaction fails, each job is stored on its own.
    bad = ids[57]
    for sup in sups.values():
        sup.train_step()
    sups[bad].push({"type": "state", "state": "NOT_A_STATE", "message": "?"})
    drains = {job_id: sups[job_id].drain.fn(2) for job_id in ids}
    reconciler.apply_many(drains)
    with sessions() as s:
        seqs = {job_id: seq for job_id, seq in s.execute(select(Job.id, Job.drained_seq))}
    assert seqs[bad] == 2  # not stored: drained again next pass
    assert all(seqs[job_id] == 3 for job_id in ids if job_id != bad)
    assert _count(sessions, JobMetric) == 200 * 2 + 199


def _checkpoint_drain(sup: FakeSupervisor, step: int) -> dict:
    sup.push({"type": "event", "kind": "checkpoint", "message": f"checkpoint at step {step}",
              "data": {"step": step, "duration_s": 0.5}, "event": CheckpointEvent(step, 0.5)})
    sup.train_step()
    return sup.drain.fn(0)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_checkpoint_bytes_are_listed_after_the_commit_and_written_into_the_event(sessions, tmp_path, monkeypatch):
    cluster = FakeCluster()
    [job_id] = running_jobs(sessions, cluster, 1)
    reconciler = _reconciler(sessions, tmp_path, cluster)
    where = checkpoint_root(reconciler.settings.job_storage(job_id)) / step_name(10)
    where.write_bytes("shard-0", b"x" * 1000)
    where.write_bytes(".metadata", b"y" * 24)
    listed_inside: list[bool] = []
    original = Storage.sizes

    def sizes(self, rel=""):
        listed_inside.append(_count(sessions, Checkpoint) == 1)  # the pass has committed by now
        return original(self, rel)

    monkeypatch.setattr(Storage, "sizes", sizes)
    reconciler.apply(job_id, _checkpoint_drain(next(iter(cluster.supervisors.values())), 10))
    assert reconciler.drain_background()
    assert listed_inside == [True]
    with sessions() as s:
        event = s.scalar(select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == "checkpoint"))
    assert event.data == {"step": 10, "duration_s": 0.5, "bytes": 1024}
    assert value(reconciler.metrics, "trainyard_checkpoint_bytes", job=job_id) == 1024
    assert value(reconciler.metrics, "trainyard_checkpoints_total", job=job_id) == 1


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("store", ["raises", "hangs"])
def test_a_store_that_fails_or_hangs_does_not_hold_up_the_pass(sessions, tmp_path, monkeypatch, store):
    cluster = FakeCluster()
    [job_id] = running_jobs(sessions, cluster, 1)
    reconciler = _reconciler(sessions, tmp_path, cluster)
    release = threading.Event()

    def sizes(self, rel=""):
        if store == "raises":
            raise OSError("the store is down")
        release.wait(30)
        return {"shard-0": 5}

    monkeypatch.setattr(Storage, "sizes", sizes)
    sup = next(iter(cluster.supervisors.values()))
    _checkpoint_drain(sup, 10)
    started = time.monotonic()
    reconciler.tick()
    assert time.monotonic() - started < 2.0
    assert _count(sessions, Checkpoint, job_id=job_id) == 1 and _count(sessions, JobMetric, job_id=job_id) == 1
    sup.train_step()
    reconciler.tick()  # the next pass goes on while the store is still away
    assert _count(sessions, JobMetric, job_id=job_id) == 2
    release.set()
    assert reconciler.drain_background()
    with sessions() as s:
        event = s.scalar(select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.kind == "checkpoint"))
    assert event.data.get("bytes") == (None if store == "raises" else 5)
