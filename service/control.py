"""ControlPlane: what one `trainyard serve` process owns besides HTTP.

Start-up migrates the database, bootstraps the admin credential, connects to
Ray in the background (so /healthz answers at once and /readyz turns ready when
Ray is there) and runs the control loops.

Threads of a replica (besides HTTP): `trainyard-control` connects to Ray, keeps the cluster's
capacity fresh (every replica admits against it) and tries for the leader lease; `trainyard-lease`
renews it. While this replica leads, two more (service/leader_loops.py): `trainyard-reconciler` (a pass every
loop_interval_s, then the standby pool's refill and the periodic sweeps) and `trainyard-scheduler`
(a tick when a submit or a job's end wakes it, else every loop_interval_s), so admission never
waits behind a slow pass. Both write through sessions fenced by this leadership term's token and
share the supervisors' handles and launcher under the reconciler's launch lock; losing the lease
stops and joins both before anything is handed over.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

from service import quotas
from service.admission.submit import Admission
from service.cluster_port import Cluster
from service.cluster_view import ClusterView
from service.db import tenants as tenant_repo
from service.db.engine import Sessions, make_engine, make_sessionmaker, migrate
from service.db.group_commit import GroupCommit
from service.db.job_reader import JobReader
from service.leader_loops import LeaderLoops
from service.leases import LeaderLease, LeaseHeld
from service.live_metrics import LiveMetrics
from service.metrics import make_registry
from service.settings import Settings
from service.shared_state import SharedState
from service.supervisor.placement import placement_problem

if TYPE_CHECKING:
    from service.supervisor.standby import StandbyPool

log = logging.getLogger("trainyard.control")
# How stale a replica's view of the cluster's size may get. Admission refuses a job that can never
# run on it, so a view from before a node returned (or the autoscaler added one) refuses good jobs.
CAPACITY_REFRESH_S = 1.0


class ControlPlane:
    """`shared`: this process is one of several `trainyard serve --workers` processes. The primary
    (api_only=False) is the whole control plane; an API worker (api_only=True) answers requests from
    the database and the shared state only: no Ray, no loops, no migrations (the primary ran them)."""

    def __init__(self, settings: Settings, shared: SharedState | None = None, api_only: bool = False,
                 cluster: Cluster | None = None):
        """`cluster`: what the loops run jobs on (service/cluster_port.py); None = Ray, as configured."""
        self.settings = settings
        if cluster is None:
            from service.ray_cluster import RayCluster

            cluster = RayCluster(settings)
        self.cluster = cluster
        self.shared, self.api_only = shared, api_only
        self.engine = make_engine(settings.db_url)
        self.sessions: Sessions = make_sessionmaker(self.engine)
        # the API's small write transactions, batched; a batch's submits are prepared at once
        self.writes = GroupCommit(self.sessions, prepare=quotas.prepare_submits)
        self.job_reader = JobReader(self.engine)  # the API's hottest read
        self.registry = make_registry(self.sessions)
        self.live = LiveMetrics(self.registry, settings.metrics_retention_s, settings.peak_flops_per_worker)
        self.ray_ready = shared.ray_ready if shared else threading.Event()
        self._ray_error: str | None = None
        self._supervisor_placement: str | None = None
        self._capacity: tuple[dict, dict] | None = None  # (cluster total, largest node), refreshed by the loop
        self._capacity_at = 0.0  # monotonic time of the last refresh
        self.cluster_view = ClusterView(settings.node_return_grace_s)
        self._stop = threading.Event()
        self.wake = shared.wake if shared else threading.Event()  # a submit: schedule now, not at the next tick
        self.admission = Admission(settings, self.writes, lambda: self.capacity, self.wake)
        self._thread: threading.Thread | None = None
        self.pool: StandbyPool | None = None  # the leader's, while it leads
        self.lease: LeaderLease | None = None

    @property
    def capacity(self) -> tuple[dict, dict] | None:
        return self.shared.capacity if self.shared else self._capacity

    @capacity.setter
    def capacity(self, value: tuple[dict, dict] | None) -> None:
        if self.shared:
            self.shared.capacity = value
        self._capacity = value

    @property
    def supervisor_placement(self) -> str | None:
        """Why no supervisor can be placed (service/supervisor/placement.py), None when one can."""
        return self.shared.supervisor_placement if self.shared else self._supervisor_placement

    @supervisor_placement.setter
    def supervisor_placement(self, value: str | None) -> None:
        if self.shared:
            self.shared.supervisor_placement = value
        self._supervisor_placement = value

    @property
    def ray_error(self) -> str | None:
        return self.shared.ray_error if self.shared else self._ray_error

    @ray_error.setter
    def ray_error(self, value: str | None) -> None:
        if self.shared:
            self.shared.ray_error = value
        self._ray_error = value

    def observe_http(self, method: str, route: str, status: int, seconds: float) -> None:
        if self.api_only:
            assert self.shared is not None, "an API worker is always given the primary's shared state"
            self.shared.observe_http(method, route, status, seconds)  # the primary's /metrics counts it
        else:
            self.live.http(method, route, status, seconds)

    # --- lifecycle -----------------------------------------------------------

    def start(self) -> None:
        self.settings.home.mkdir(parents=True, exist_ok=True)
        if self.api_only:
            gc.freeze()  # as the primary does once it is up: no full GC passes over the imports
            assert self.shared is not None, "an API worker is always given the primary's shared state"
            self.shared.worker_up(+1)
            return
        migrate(self.engine)
        self.bootstrap_admin()
        if self.settings.control_loops:
            self.lease = lease = LeaderLease(self.sessions, self.settings.lease_ttl_s)
            if self.engine.dialect.name == "sqlite" and not self._wait_for_lease(lease):
                raise LeaseHeld(
                    f"another trainyard serve ({lease.current_holder}) runs the control loops on "
                    f"{self.settings.db_url}: SQLite supports one control-plane replica. Stop that one, "
                    "or point every replica at PostgreSQL (TRAINYARD_DATABASE_URL) to run two or more.")
            lease.keep_renewed()
        self._thread = threading.Thread(target=self._main, name="trainyard-control", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.writes.close()
        if self.api_only:
            assert self.shared is not None, "an API worker is always given the primary's shared state"
            self.shared.worker_up(-1)
            self.engine.dispose()
            return
        log.info("stopping the control plane")
        self._stop.set()
        self.wake.set()
        if self._thread is not None:  # it lets Ray go before it ends (_main)
            self._thread.join(timeout=60)
        if self.lease is not None:
            self.lease.release()
        self.engine.dispose()

    def _wait_for_lease(self, lease: LeaderLease) -> bool:
        """SQLite: the lease, once a previous process's has expired (a restart on another host or
        pod); False if its holder keeps renewing it, i.e. another replica is alive."""
        deadline = time.monotonic() + self.settings.lease_ttl_s + 1.0
        while not lease.try_acquire():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.5)
        return True

    @property
    def leading(self) -> bool:
        """This replica runs the scheduler and reconciler now (it holds the control lease)."""
        return self.lease is not None and self.lease.held()

    def bootstrap_admin(self) -> None:
        """TRAINYARD_ADMIN_TOKEN, or in embedded mode a generated one kept in TRAINYARD_HOME (0600)."""
        token = self.settings.admin_token
        if not token:
            path = self.settings.admin_token_file
            if path.exists():
                token = path.read_text().strip()
            else:
                token = tenant_repo.new_token()
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(token + "\n")
                log.info("generated an admin token in %s", path)
        with self.sessions.begin() as s:
            tenant_repo.ensure_token(s, tenant_repo.ensure_tenant(s, "admin"), token, "bootstrap admin", is_admin=True)

    # --- the loop ------------------------------------------------------------

    def _main(self) -> None:
        try:
            self._run_loops()
        finally:
            self._release_ray()

    def _release_ray(self) -> None:
        """Our standbys go, and a local Ray this process started stops with every process of it.
        This thread started that Ray, and its daemons die with it (a parent-death signal, which
        Linux sends when the parent *thread* ends): so it stops Ray before it ends, not after."""
        if not self.ray_ready.is_set():
            return
        if self.pool is not None:
            self.pool.shutdown()  # our standbys; the next leader starts its own
        self.cluster.release()

    def _run_loops(self) -> None:
        while not self._stop.is_set():
            try:
                self.cluster.connect()
                self._refresh_capacity()
                break
            except Exception as exc:  # Ray not reachable yet: keep trying, /readyz says why
                self.ray_error = f"{type(exc).__name__}: {exc}"
                log.warning("connecting to Ray failed: %s", self.ray_error)
                self._stop.wait(2.0)
        self.ray_error = None
        # Everything imported and built so far lives as long as the process: keep it out of the
        # cyclic GC, whose full passes over it would otherwise stall requests by 100+ ms.
        gc.collect()
        gc.freeze()
        self.ray_ready.set()
        if not self.settings.control_loops:
            while not self._stop.wait(CAPACITY_REFRESH_S):  # keep Ray until the process stops (_release_ray)
                self._refresh_capacity_quietly()
            return
        lease = self.lease
        assert lease is not None, "start() takes the lease before this thread when control_loops is on"
        loops: LeaderLoops | None = None
        last_try = 0.0
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                if started - self._capacity_at >= CAPACITY_REFRESH_S:  # leader or not: every replica admits
                    self._refresh_capacity_quietly()
                try:
                    # Only the lease holder schedules and reconciles; the others serve the API and try
                    # for the lease once per interval, to take over from a dead leader.
                    if not lease.held() and started - last_try >= self.settings.loop_interval_s:
                        last_try = started
                        lease.try_acquire()
                    if loops is not None and not loops.leading():
                        log.warning("stepping down: this replica no longer holds the control lease")
                        self._step_down(loops)
                        loops = None
                    if loops is None and lease.held():
                        loops = LeaderLoops(self, lease)
                        loops.start()
                except Exception:
                    log.exception("control loop tick failed; retrying")
                self._stop.wait(min(self.settings.loop_interval_s, CAPACITY_REFRESH_S))
        finally:
            self._step_down(loops)  # both loops end before Ray is let go (_release_ray)

    def _refresh_capacity(self) -> None:
        nodes = self.cluster.nodes()
        self.capacity = self.cluster_view.observe(nodes)
        self.supervisor_placement = placement_problem(self.settings.supervisor_resource,
                                                      self.settings.supervisor_memory_mb, nodes)
        self._capacity_at = time.monotonic()

    def _refresh_capacity_quietly(self) -> None:
        """A failed refresh keeps the last view (Ray's GCS restarting is not a reason to refuse jobs)."""
        try:
            self._refresh_capacity()
        except Exception as exc:
            log.warning("refreshing the cluster's capacity failed: %s: %s", type(exc).__name__, exc)

    def _step_down(self, loops: LeaderLoops | None) -> None:
        """Lost the lease: forget the supervisors' handles (the new leader re-attaches by name)."""
        if loops is not None:
            loops.close()
        self.pool = None

    def sweep_orphans(self, actors: Iterable[str] | None = None,
                      lock: AbstractContextManager = nullcontext()) -> None:
        """Kill supervisors nobody needs: those of ended jobs, and this plane's stale standbys
        (e.g. a control plane died before it could). Other planes' actors are left alone.
        `actors`: the named actors listed before; `lock`: held while deciding (service/sweeps.py)."""
        from service.sweeps import sweep_orphans

        pool = self.pool
        assert pool is not None, "called by the leader's LeaderLoops, which set the pool"
        sweep_orphans(self.sessions, self.cluster, pool, actors, lock)
