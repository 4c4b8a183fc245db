"""A scheduler tick commits every admission before it starts any supervisor (service/scheduler.py,
service/scheduler_launches.py): while the first job's supervisor start waits on the cluster, the
second job admitted in the same tick is already STARTING for any other database connection; and a
reconcile pass neither waits for a start under way (it runs outside the launch lock) nor takes its job
for a lost one. A job is marked launching before its admission commits: a reconcile pass, which takes no
lock against the tick, never reads it STARTING without the mark."""

from __future__ import annotations

import threading

from service.db import repository as repo
from service.db import tenants as tenant_repo
from service.db.engine import make_engine, make_sessionmaker
from service.lifecycle import JobState
from service.live_metrics import LiveMetrics
from service.reconciler import Reconciler
from service.scheduler import Scheduler
from service.settings import Settings
from tests.helpers import spec_of


class _Supervisor:
    class start:  # noqa: N801 - shaped like an actor method
        @staticmethod
        def remote(*args):
            return None

    drain = start  # answered by no one: the cluster's gather returns nothing


class BlockingCluster:
    """The cluster port with room for both jobs; creating the first supervisor waits on `release`."""

    def __init__(self):
        self.launching = threading.Event()  # the first supervisor start has begun
        self.release = threading.Event()
        self.supervisors: list[str] = []

    def available_resources(self) -> dict[str, float]:
        return {"CPU": 8.0, "GPU": 0.0}

    def created_group_owners(self) -> set:
        return set()

    def create_supervisor(self, name: str):
        if not self.supervisors:
            self.launching.set()
            assert self.release.wait(20), "the test never let the first start finish"
        self.supervisors.append(name)
        return _Supervisor()


def test_the_second_admission_is_committed_while_the_first_supervisor_start_waits(db_url, sessions, tmp_path):
    spec = spec_of()  # 1 worker, 1 CPU
    with sessions.begin() as s:
        tenant = tenant_repo.ensure_tenant(s, "acme")
        first = repo.create_job(s, tenant.id, spec, 0, "sha", None, max_open_jobs=None).id
        second = repo.create_job(s, tenant.id, spec, 0, "sha", None, max_open_jobs=None).id
    cluster = BlockingCluster()
    size = {"CPU": 8.0, "GPU": 0.0}
    scheduler = Scheduler(sessions, Settings(home=tmp_path, standby_supervisors=0), cluster=cluster,
                          capacity=lambda: (size, size))
    admitted: list[list[str]] = []
    tick = threading.Thread(target=lambda: admitted.append(scheduler.tick()), daemon=True)
    tick.start()
    other = make_engine(db_url)  # another connection: sees only what the tick has committed
    try:
        assert cluster.launching.wait(20), "the tick never started a supervisor"
        with make_sessionmaker(other)() as s:
            states = {job_id: repo.get_job(s, job_id).state for job_id in (first, second)}
        assert states == {first: JobState.STARTING, second: JobState.STARTING}
    finally:
        cluster.release.set()
        tick.join(20)
        other.dispose()
    assert admitted == [[first, second]]
    assert len(cluster.supervisors) == 2  # both supervisors were started once the start went on
    assert set(scheduler.handles) == {first, second}


class _ClusterWithoutSupervisors(BlockingCluster):
    """As BlockingCluster; a reconcile pass that looked for a launching job's supervisor would find none."""

    def find_supervisor(self, name):
        return None

    def gather(self, refs, timeout_s):
        return {}


def test_a_reconcile_pass_neither_waits_for_a_supervisor_start_nor_takes_its_job_for_lost(sessions, tmp_path,
                                                                                          monkeypatch):
    with sessions.begin() as s:
        tenant = tenant_repo.ensure_tenant(s, "acme")
        job_id = repo.create_job(s, tenant.id, spec_of(), 0, "sha", None, max_open_jobs=None).id
    cluster = _ClusterWithoutSupervisors()
    size = {"CPU": 8.0, "GPU": 0.0}
    settings = Settings(home=tmp_path, standby_supervisors=0)
    reconciler = Reconciler(sessions, settings, launcher=object(), metrics=LiveMetrics(), cluster=cluster)
    scheduler = Scheduler(sessions, settings, handles=reconciler.handles, cluster=cluster,
                          capacity=lambda: (size, size))
    recovered: list[str] = []
    monkeypatch.setattr(reconciler, "recover", recovered.append)
    assert scheduler.tick(launch=False) == [job_id]  # as the leader's loop: no lock, starts after the tick
    launch = threading.Thread(target=scheduler.launch_pending, daemon=True)
    launch.start()
    try:
        assert cluster.launching.wait(20), "the supervisor start never began"
        passed = threading.Thread(target=reconciler.tick, daemon=True)
        passed.start()
        passed.join(10)
        assert not passed.is_alive(), "the reconcile pass waited for the supervisor start"
        assert recovered == []  # a job whose start is under way is not a lost one
    finally:
        cluster.release.set()
        launch.join(20)
    assert job_id in reconciler.handles and not reconciler.handles.is_launching(job_id)
    reconciler.tick()
    assert recovered == []


def test_a_job_is_marked_launching_before_its_admission_commits_and_unmarked_if_not_admitted(sessions, tmp_path):
    from sqlalchemy import event
    from sqlalchemy.orm import Session

    with sessions.begin() as s:
        tenant = tenant_repo.ensure_tenant(s, "acme")
        job_id = repo.create_job(s, tenant.id, spec_of(), 0, "sha", None, max_open_jobs=None).id
    size = {"CPU": 8.0, "GPU": 0.0}
    scheduler = Scheduler(sessions, Settings(home=tmp_path, standby_supervisors=0), cluster=BlockingCluster(),
                          capacity=lambda: (size, size))
    marked_at_commit: list[bool] = []

    def on_commit(session):  # every commit of the tick: the admission's is the one that writes STARTING
        marked_at_commit.append(scheduler.handles.is_launching(job_id))

    event.listen(Session, "before_commit", on_commit)
    try:
        assert scheduler.tick(launch=False) == [job_id]
    finally:
        event.remove(Session, "before_commit", on_commit)
    assert True in marked_at_commit and scheduler.handles.is_launching(job_id)
    with sessions() as s:
        assert repo.get_job(s, job_id).state == JobState.STARTING
    # A job cancelled before its claim is not admitted: no mark is left behind.
    with sessions.begin() as s:
        other = repo.create_job(s, tenant.id, spec_of(), 0, "sha", None, max_open_jobs=None)
        other.cancel_requested = True
        other_id = other.id
    assert scheduler._admit(other_id, dict(size)) is False
    assert not scheduler.handles.is_launching(other_id)
