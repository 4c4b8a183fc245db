"""The leader's two loops, one thread each, for one leadership term: `trainyard-reconciler` (a pass
every loop_interval_s, then the standby pool's refill and the periodic sweeps) and
`trainyard-scheduler` (a tick when a submit or a job's end wakes it, else every loop_interval_s).
Both write through sessions fenced by the term's lease token (TermSessions)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Protocol

from sqlalchemy.orm import Session

from service.cluster_port import Cluster
from service.db.engine import Sessions
from service.leases import FencedSessions, LeaderLease, LeaseLost
from service.live_metrics import LiveMetrics
from service.settings import Settings

if TYPE_CHECKING:
    from service.supervisor.standby import StandbyPool


class Wake(Protocol):
    """The scheduler's wake-up: a threading or a multiprocessing Event (API workers share it)."""

    def set(self) -> None: ...

    def clear(self) -> None: ...

    def wait(self, timeout: float | None = None) -> bool: ...


class Plane(Protocol):
    """What the loops take from the replica that leads (service/control.py ControlPlane)."""

    settings: Settings
    cluster: Cluster
    sessions: Sessions
    live: LiveMetrics
    pool: StandbyPool | None

    @property
    def wake(self) -> Wake: ...

    @property
    def capacity(self) -> tuple[dict, dict] | None: ...

    @property
    def supervisor_placement(self) -> str | None: ...

    def sweep_orphans(self, actors: Iterable[str] | None = None,
                      lock: AbstractContextManager = ...) -> None: ...

log = logging.getLogger("trainyard.control")
WAKE_GAP_S = 0.02
JOIN_TIMEOUT_S = 30.0  # a stepping-down leader waits this long for its loops' current pass


class TermSessions(FencedSessions):
    """FencedSessions for one leadership term: a write of a loop that outlived its term (a step-down
    that could not join it in time, the lease since taken back) is refused like a stale leader's."""

    def __init__(self, sessions: Sessions, lease: LeaderLease, term: int | None):
        super().__init__(sessions, lease)
        self.term = term

    @contextmanager
    def begin(self) -> Iterator[Session]:
        if self.lease.token != self.term:
            raise LeaseLost(f"the leadership term {self.term} is over (now {self.lease.token})")
        with super().begin() as s:
            yield s

    def still_leading(self) -> bool:
        return self.lease.held() and self.lease.token == self.term


class LeaderLoops:
    """The leader's scheduler, reconciler and standby pool, built when this replica takes the lease,
    each loop on a thread of its own until the term ends (close)."""

    def __init__(self, plane: Plane, lease: LeaderLease):
        from service.leaked_groups import LeakedGroups
        from service.reconciler import Reconciler
        from service.scheduler import Scheduler
        from service.supervisor.launch import Launcher
        from service.supervisor.standby import StandbyPool, plane_id

        settings = plane.settings
        if settings.warm_workers:
            from workers.runtime.pool import start_pool

            start_pool(settings.warm_workers)  # the cluster's pool of pre-imported rank workers (shared)
        self.plane, self.lease, self.term = plane, lease, lease.token
        # One standby pool name per database: the leader that follows a dead one clears its standbys.
        cluster = plane.cluster
        plane.pool = self.pool = StandbyPool(plane_id(settings.db_url), settings.standby_supervisors, cluster)
        self.fenced = fenced = TermSessions(plane.sessions, lease, self.term)
        launcher = Launcher(settings, self.pool, cluster, placement=lambda: plane.supervisor_placement)
        self.reconciler = Reconciler(fenced, settings, launcher, metrics=plane.live, cluster=cluster)
        self.reconciler.on_job_end = plane.wake.set  # capacity freed: the scheduler looks at once
        self.scheduler = Scheduler(fenced, settings, launcher, self.reconciler.handles, metrics=plane.live,
                                   capacity=lambda: plane.capacity, cluster=cluster)
        self.count = 0
        self.leaked_groups = LeakedGroups(fenced, cluster)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        plane.sweep_orphans()

    def start(self) -> None:
        self._threads = [threading.Thread(target=self._reconcile_loop, name="trainyard-reconciler", daemon=True),
                         threading.Thread(target=self._schedule_loop, name="trainyard-scheduler", daemon=True)]
        for thread in self._threads:
            thread.start()

    def leading(self) -> bool:
        """This term goes on: not closed, and the lease still held under the token it began with."""
        return not self._stop.is_set() and self.fenced.still_leading()

    def _reconcile_loop(self) -> None:
        interval = self.plane.settings.loop_interval_s
        while not self._stop.is_set():
            started = time.monotonic()
            if self.leading():
                try:
                    self.reconcile()
                except LeaseLost as exc:  # the control thread sees it too and closes this term
                    log.warning("reconciler: %s", exc)
                except Exception:
                    log.exception("reconciler pass failed; retrying")
            # a pass every interval (start to start); one that ran over is followed after a short gap
            self._stop.wait(max(WAKE_GAP_S, started + interval - time.monotonic()))

    def reconcile(self) -> None:
        """One reconciler pass, then the standbys' refill and, every 20 passes, the sweeps."""
        started = time.monotonic()
        try:
            self.reconciler.tick()
        finally:
            self.plane.live.control_pass("reconcile", time.monotonic() - started)
        with self.reconciler.launch_lock:  # the pool and the supervisors are the scheduler's too
            self.pool.refill()
            self.count += 1
        if self.count % 20 == 0 and self.leading():
            self.sweep()

    def sweep(self) -> None:
        """The orphan and leaked-group sweeps: the cluster listed outside the launch lock (seconds at a
        fleet's size, and every scheduler tick takes the lock), the decisions under it (service/sweeps.py)."""
        from service.sweeps import list_cluster

        listing = list_cluster(self.plane.cluster)
        lock = self.reconciler.launch_lock
        self.plane.sweep_orphans(listing.actors, lock)
        self.leaked_groups.sweep(listing, lock)

    def _schedule_loop(self) -> None:
        settings, wake = self.plane.settings, self.plane.wake
        while not self._stop.is_set():
            started = time.monotonic()
            wake.clear()
            if settings.scheduler_enabled and self.leading():
                try:
                    self.schedule()
                except LeaseLost as exc:
                    log.warning("scheduler: %s", exc)
                except Exception:
                    log.exception("scheduler tick failed; retrying")
            # A burst of submits wakes the scheduler once per gap, not once per submit.
            self._stop.wait(WAKE_GAP_S)
            wake.wait(max(0.0, started + settings.loop_interval_s - time.monotonic()))

    def schedule(self) -> None:
        started = time.monotonic()
        try:  # no launch lock: the tick marks its admissions launching before they commit (service/scheduler.py)
            self.scheduler.tick(launch=False)
        finally:
            self.plane.live.control_pass("schedule", time.monotonic() - started)
        self.scheduler.launch_pending()  # outside the lock: a slow start holds up no reconcile pass

    def close(self) -> None:
        """The term is over: both loops stop (joined, so nothing of this term runs on), then the
        handles are forgotten (the next leader re-attaches by name) and our standbys go."""
        self._stop.set()
        self.plane.wake.set()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=JOIN_TIMEOUT_S)
                if thread.is_alive():
                    log.warning("%s did not stop in %.0f s; its writes are fenced", thread.name, JOIN_TIMEOUT_S)
        self.reconciler.close()
        try:
            self.pool.shutdown()  # our standbys; the next leader starts its own
        except Exception:
            pass
