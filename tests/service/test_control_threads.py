"""The leader's scheduler and reconciler on threads of their own (service/control.py): a submit is
admitted while supervisors are slow to answer, and a reconcile pass waits for them at most its deadline;
a replica that loses the lease stops both loops and writes nothing more."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import pytest
from sqlalchemy import select, update

from bench.control_pass import FakeCluster, running_jobs
from service.control import ControlPlane
from service.db import repository as repo
from service.db import tenants as tenant_repo
from service.db.models import Job, LeaseRow
from service.settings import Settings
from tests.helpers import spec_of

GATHER_S = 3.0
LISTING_S = 2.0
LOOPS = {"trainyard-scheduler", "trainyard-reconciler"}


class SlowCluster(FakeCluster):
    """Every drain takes GATHER_S to come back (supervisors on a loaded cluster): a gather with a shorter
    deadline gets no answer, as Ray's does."""

    def __init__(self):
        super().__init__(gather_delay_s=GATHER_S)
        self.gathering = threading.Event()
        self.unanswered = 0

    def gather(self, refs, timeout_s):
        from service.cluster_port import Reply, ReplyKind

        if refs:
            self.gathering.set()
        if refs and timeout_s < GATHER_S:
            time.sleep(timeout_s)
            self.unanswered += len(refs)
            return {key: Reply(ReplyKind.NO_ANSWER, error="no answer yet") for key in refs}
        return super().gather(refs, timeout_s)


@pytest.fixture
def plane(db_url, tmp_path):
    cluster = SlowCluster()
    settings = Settings(home=tmp_path, database_url=db_url, loop_interval_s=0.2, standby_supervisors=0,
                        warm_workers=0, lease_ttl_s=2.0)
    plane = ControlPlane(settings, cluster=cluster)
    plane.start()
    running_jobs(plane.sessions, cluster, 1)
    spec_of()
    try:
        yield plane, cluster
    finally:
        plane.stop()


class SlowListingCluster(FakeCluster):
    """Once armed, listing the placement groups takes LISTING_S (a fleet's thousands of groups)."""

    def __init__(self):
        super().__init__()
        self.armed = False
        self.listing = threading.Event()
        self.listing_started = 0.0

    def placement_groups(self) -> dict[str, dict]:
        if self.armed:
            self.listing_started = time.monotonic()
            self.listing.set()
            time.sleep(LISTING_S)
        return {}


class SlowCapacityCluster(FakeCluster):
    """Once armed, reading the free resources takes READ_S (a scheduler tick's call to a loaded cluster);
    a kill takes READ_S too."""

    def __init__(self):
        super().__init__()
        self.armed = False
        self.reading = threading.Event()

    def available_resources(self) -> dict[str, float]:
        if self.armed:
            self.reading.set()
            time.sleep(READ_S)
        return super().available_resources()

    def kill(self, handle) -> None:
        time.sleep(READ_S)
        super().kill(handle)


READ_S = 2.0


def _submit(plane) -> str:
    spec = spec_of(**{"train.steps": 10})  # (not inside the transaction: its first call imports a lot)
    with plane.sessions.begin() as s:
        tenant = tenant_repo.ensure_tenant(s, "acme")
        job = repo.create_job(s, tenant.id, spec, 0, "sha", None, max_open_jobs=None)
        job_id = job.id
    plane.wake.set()
    return job_id


def _state(plane, job_id: str) -> str:
    with plane.sessions() as s:
        return s.scalar(select(Job.state).where(Job.id == job_id))


def _submit_and_wait_admitted(plane) -> float:
    """Submit a job and wait for its STARTING; the time it was admitted, asserted within 1 s of the submit."""
    submitted = time.monotonic()
    job_id = _submit(plane)
    while _state(plane, job_id) == "QUEUED" and time.monotonic() - submitted < 5:
        time.sleep(0.02)
    admitted = time.monotonic()
    assert _state(plane, job_id) == "STARTING"
    assert admitted - submitted < 1.0, f"admitted after {admitted - submitted:.2f} s"
    return admitted


def test_slow_supervisors_hold_up_neither_a_submit_nor_the_reconcile_pass(plane):
    plane, cluster = plane
    assert cluster.gathering.wait(10), "the reconciler never drained the running job"
    _submit_and_wait_admitted(plane)  # within a second, though no drain has come back
    deadline = time.monotonic() + 2 * GATHER_S
    while _passes(plane, "reconcile")[0] < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    reconciles, reconcile_s = _passes(plane, "reconcile")
    # Each pass waited its deadline (half the loop's 0.2 s interval), not the supervisors' 3 s.
    assert reconciles >= 3 and reconcile_s / reconciles < GATHER_S / 4, (reconciles, reconcile_s)
    assert cluster.unanswered >= reconciles - 1  # and the drains were still out


@contextmanager
def _fast_plane(db_url, tmp_path, cluster):
    """A started control plane on `cluster`, its loops every 0.1 s; stopped on exit."""
    settings = Settings(home=tmp_path, database_url=db_url, loop_interval_s=0.1, standby_supervisors=0,
                        warm_workers=0, lease_ttl_s=2.0)
    plane = ControlPlane(settings, cluster=cluster)
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


def test_a_submit_is_admitted_while_the_periodic_sweep_lists_the_cluster(db_url, tmp_path):
    cluster = SlowListingCluster()
    with _fast_plane(db_url, tmp_path, cluster) as plane:
        spec_of()  # its first call imports a lot: not inside the timed submit
        cluster.armed = True  # the sweep every 20 reconciler passes lists the groups from now on
        assert cluster.listing.wait(15), "the leader never swept"
        admitted = _submit_and_wait_admitted(plane)
        assert admitted < cluster.listing_started + LISTING_S  # the listing was still going on


def test_reconcile_passes_go_on_while_a_scheduler_tick_waits_on_the_cluster(db_url, tmp_path):
    """The tick takes no lock the reconciler holds: its reads and cluster calls hold up no reconcile pass
    (before, the whole tick held the launch lock, and the passes stopped while it waited)."""
    cluster = SlowCapacityCluster()
    with _fast_plane(db_url, tmp_path, cluster) as plane:
        running_jobs(plane.sessions, cluster, 1)
        spec_of()  # its first call imports a lot: not inside the timed part
        cluster.armed = True
        job_id = _submit(plane)
        assert cluster.reading.wait(10), "the scheduler never read the free resources"
        before, _ = _passes(plane, "reconcile")
        time.sleep(READ_S * 0.75)
        after, _ = _passes(plane, "reconcile")
        assert _state(plane, job_id) == "QUEUED"  # the tick was still waiting on the cluster
        assert after - before >= 3, f"{after - before:g} reconcile passes while the tick waited"


def test_retiring_a_supervisor_does_not_wait_for_its_kill(tmp_path):
    from service.live_metrics import LiveMetrics
    from service.reconciler import Reconciler

    cluster = SlowCapacityCluster()
    handle = cluster.create_supervisor("trainyard-supervisor-x-1")
    reconciler = Reconciler(lambda: None, Settings(home=tmp_path), launcher=object(), metrics=LiveMetrics(),
                            cluster=cluster)
    try:
        started = time.monotonic()
        reconciler._retire("x", handle)
        assert time.monotonic() - started < READ_S / 4, "the pass waited for the kill"
        assert reconciler.drain_background(10 * READ_S)
        assert cluster.killed == [handle]  # and it was killed all the same
    finally:
        reconciler.close()


def _passes(plane, loop: str) -> tuple[float, float]:
    """(count, sum of seconds) of trainyard_control_pass_seconds{loop=...} as /metrics renders it."""
    from prometheus_client import generate_latest

    text = generate_latest(plane.registry).decode()
    values = {}
    for line in text.splitlines():
        for part in ("_count", "_sum"):
            if line.startswith(f'trainyard_control_pass_seconds{part}{{loop="{loop}"}}'):
                values[part] = float(line.rsplit(" ", 1)[1])
    return values.get("_count", 0.0), values.get("_sum", 0.0)


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_replica_that_lost_the_lease_stops_both_loops_and_writes_nothing(plane):
    plane, cluster = plane
    assert cluster.gathering.wait(10)
    assert LOOPS <= {t.name for t in threading.enumerate()}
    with plane.sessions.begin() as s:  # another replica took the lease over (ours looked expired to it)
        s.execute(update(LeaseRow).values(holder="elsewhere", token=LeaseRow.token + 1, expires_at=time.time() + 600))
    deadline = time.monotonic() + 20  # the next renewal sees it (ttl/4), then the pass in flight ends
    while LOOPS & {t.name for t in threading.enumerate() if t.is_alive()} and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not LOOPS & {t.name for t in threading.enumerate() if t.is_alive()}
    assert not plane.leading
    with plane.sessions() as s:
        [running] = s.scalars(select(Job).where(Job.state == "RUNNING")).all()
        seq = running.drained_seq
    for sup in cluster.supervisors.values():
        sup.train_step()
    job_id = _submit(plane)
    time.sleep(1.5)
    assert _state(plane, job_id) == "QUEUED"
    with plane.sessions() as s:
        assert s.get(Job, running.id).drained_seq == seq
