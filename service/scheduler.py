"""Admission: QUEUED jobs start, highest priority first then oldest first, when Ray has room.

Free resources are read from Ray, minus what admitted jobs will take but do
not hold yet (a job between admission and its placement group being created,
or one recovering while its group is re-formed), so two ticks never promise
the same CPUs twice. Admission is strictly in order: a job that does not fit
now holds back the jobs behind it, so a big job is never starved by small ones.

With several control-plane replicas only the lease holder schedules (service/leases.py),
its writes fenced by the lease token; on top of that a job is claimed with
`SELECT ... FOR UPDATE SKIP LOCKED` (PostgreSQL), so a row another transaction holds
(a second scheduler, a cancel in flight) is passed over this tick, never admitted twice.

With TRAINYARD_PREEMPTION a tenant's first queued job that waits (on the cluster or on its
tenant's max_workers quota) asks the same tenant's lower-priority running jobs to checkpoint
and requeue (service/preemption.py), once per head job and tick.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import ray
from sqlalchemy import select

from service import preemption
from service.cluster_view import Capacity, ClusterView
from service.db import repository as repo
from service.db.engine import SessionSource
from service.db.models import Job, utcnow
from service.lifecycle import JobState
from service.live_metrics import LiveMetrics
from service.preemption import Shortfall, choose_victims, row_of
from service.quotas import admissible
from service.restart_history import restarts_used
from service.settings import Settings
from service.supervisor.launch import Launcher
from workers.runtime.group_owner import GroupOwner

log = logging.getLogger("trainyard.scheduler")
EPS = 1e-6


@dataclass(frozen=True)
class Demand:
    cpus: float
    gpus: float
    cpus_per_worker: float
    gpus_per_worker: float


def demand_of(spec) -> Demand:
    r = spec.resources
    return Demand(r.cpus_per_worker * spec.world_size, r.gpus_per_worker * spec.world_size,
                  r.cpus_per_worker, r.gpus_per_worker)


def never_fits(demand: Demand, total: dict[str, float], largest_node: dict[str, float]) -> str | None:
    """Why the job can never run on this cluster, or None if it can once resources free up."""
    for key, need, per_worker in (("CPU", demand.cpus, demand.cpus_per_worker),
                                  ("GPU", demand.gpus, demand.gpus_per_worker)):
        have = total.get(key, 0.0)
        if need > have + EPS:
            return (f"resources: the job needs {need:g} {key} in all (resources.workers x resources."
                    f"{key.lower()}s_per_worker) but the whole cluster has {have:g}")
        if per_worker > largest_node.get(key, 0.0) + EPS:
            return (f"resources.{key.lower()}s_per_worker: {per_worker:g} {key} per worker is more than the "
                    f"largest node has ({largest_node.get(key, 0.0):g})")
    return None


class Scheduler:
    def __init__(self, sessions: SessionSource, settings: Settings, launcher: Launcher | None = None,
                 handles: dict | None = None, metrics: LiveMetrics | None = None,
                 capacity: Callable[[], Capacity | None] | None = None):
        """`capacity`: the cluster's size as the control plane sees it (service/cluster_view.py); None
        reads the nodes alive now from Ray."""
        self.sessions, self.settings = sessions, settings
        self.capacity = capacity or (lambda: ClusterView(grace_s=0).observe(ray.nodes()))
        self.metrics = metrics or LiveMetrics()
        self.launcher = launcher or Launcher(settings)
        self.handles = handles if handles is not None else {}  # shared with the reconciler

    def tick(self) -> list[str]:
        """Admit what fits now; returns the admitted job ids."""
        with self.sessions() as s:
            waiting = repo.queued_jobs(s)
            queue = admissible(s, waiting)  # per-tenant max_workers quotas
            reserved = self._reserved_not_held(repo.active_jobs(s)) if queue else {}
            heads = self._quota_blocked(s, waiting, queue) if self.settings.preemption and waiting else []
        if not queue:
            self._preempt_for(heads)
            return []
        free = ray.available_resources()
        free = {k: free.get(k, 0.0) - reserved.get(k, 0.0) for k in ("CPU", "GPU")}
        admitted = []
        capacity: Capacity | None = None
        for job in queue:
            if job.cpus > free["CPU"] + EPS or job.gpus > free["GPU"] + EPS:
                # Accepted before the cluster's size was known, or the cluster shrank: fail it
                # rather than let it hold up the queue forever.
                capacity = capacity or self.capacity()
                demand = Demand(job.cpus, job.gpus, job.cpus / job.world_size, job.gpus / job.world_size)
                if capacity and (why := never_fits(demand, *capacity)) and self._fail(job.id, why):
                    continue
                self.metrics.decision("deferred")
                if self.settings.preemption:
                    heads.append((row_of(job), Shortfall(cpus=job.cpus - free["CPU"], gpus=job.gpus - free["GPU"])))
                break  # strict order: nothing jumps the queue
            outcome = self._admit(job.id, free)
            if outcome is None:
                break  # held by another transaction: try again next tick, still in order
            if outcome:
                free["CPU"] -= job.cpus
                free["GPU"] -= job.gpus
                admitted.append(job.id)
                self.metrics.decision("admitted")
        self._preempt_for(heads)
        return admitted

    @staticmethod
    def _quota_blocked(s, waiting: list[Job], queue: list[Job]) -> list[tuple]:
        """Each tenant's first queued job when its max_workers quota holds it back, with the workers it lacks."""
        caps = {t.id: t.max_workers for t in repo.list_tenants(s) if t.max_workers is not None}
        held = repo.active_workers_by_tenant(s)
        passed, seen, heads = {j.id for j in queue}, set(), []
        for job in waiting:
            if job.tenant_id in seen:
                continue
            seen.add(job.tenant_id)
            if job.id not in passed and job.tenant_id in caps:
                lack = held.get(job.tenant_id, 0) + job.world_size - caps[job.tenant_id]
                heads.append((row_of(job), Shortfall(workers=lack)))
        return heads

    def _preempt_for(self, heads: list[tuple]) -> None:
        """Ask victims to make room for each waiting head job, in one fenced transaction."""
        if not heads:
            return
        with self.sessions.begin() as s:  # fenced: a replica that lost the lease asks nothing
            active = repo.active_jobs(s)
            asked = preemption.pending(s, active)  # in flight: never asked twice
            by_id = {j.id: j for j in active}
            rows = [row_of(j) for j in active if j.id not in asked]
            for head, short in heads:
                if head.id in asked.values():
                    continue  # its victims are still checkpointing
                for victim in choose_victims(head, rows, short):
                    preemption.request(s, by_id[victim.id], head)
                    asked[victim.id] = head.id
                    rows.remove(victim)
                    self.metrics.decision("preempted")
                    log.info("preempting %s (priority %d) for %s (priority %d)",
                             victim.id, victim.priority, head.id, head.priority)

    def _reserved_not_held(self, active) -> dict[str, float]:
        """Resources of STARTING/RECOVERING jobs whose placement group is not created yet."""
        waiting = [j for j in active if j.state in (JobState.STARTING, JobState.RECOVERING)]
        if not waiting:
            return {}
        held = {owner for pg in ray.util.placement_group_table().values() if pg.get("state") == "CREATED"
                if (owner := GroupOwner.of_group(pg.get("name", ""))) is not None}
        reserved = {"CPU": 0.0, "GPU": 0.0}
        for job in waiting:
            if GroupOwner(job.id, job.supervisor_epoch) not in held:
                reserved["CPU"] += job.cpus
                reserved["GPU"] += job.gpus
        return reserved

    @staticmethod
    def _claim(s, job_id: str) -> Job | None:
        """The QUEUED row, locked for this transaction; None if gone, no longer queued or locked elsewhere."""
        q = select(Job).where(Job.id == job_id, Job.state == JobState.QUEUED).with_for_update(skip_locked=True)
        return s.scalar(q)

    def _fail(self, job_id: str, why: str) -> bool:
        with self.sessions.begin() as s:
            job = self._claim(s, job_id)
            if job is None:
                return False
            job.error = f"the job can never run on this cluster: {why}"
            repo.transition(s, job, JobState.FAILED, job.error)
            return True

    def _admit(self, job_id: str, free: dict[str, float]) -> bool | None:
        """True: admitted. False: no longer admissible (cancelled, gone). None: locked elsewhere."""
        reservation = self.launcher.reserve()
        try:
            with self.sessions.begin() as s:  # fenced: a replica that lost the lease writes nothing
                job = self._claim(s, job_id)
                if job is None or job.cancel_requested:
                    self.launcher.release(reservation)
                    return None if job is None and self._still_queued(job_id) else False
                created = job.created_at if job.created_at.tzinfo else job.created_at.replace(tzinfo=utcnow().tzinfo)
                self.metrics.queue_wait((utcnow() - created).total_seconds())
                repo.transition(s, job, JobState.STARTING,
                                f"admitted: needs {job.cpus:g} CPU / {job.gpus:g} GPU, {free['CPU']:g} CPU free")
                job.supervisor_epoch += 1
                job.drained_seq = 0
                job.supervisor_name = self.launcher.name(reservation, job.id, job.supervisor_epoch)
                spec, epoch, total_steps = job.spec, job.supervisor_epoch, job.total_steps
                used = restarts_used(s, job.id)  # a preempted job's earlier restarts count
        except Exception:
            self.launcher.release(reservation)
            raise
        # Committed first: if this process dies right here the reconciler starts the supervisor. A
        # replica that lost the lease since leaves that to the new leader (never two supervisors).
        if not getattr(self.sessions, "still_leading", lambda: True)():
            return True
        try:
            self.handles[job_id] = self.launcher.launch(reservation, job_id, spec, epoch, total_steps, used)
        except Exception as exc:  # retried by the reconciler
            log.warning("starting the supervisor of %s failed: %s", job_id, exc)
        return True

    def _still_queued(self, job_id: str) -> bool:
        with self.sessions() as s:
            job = repo.get_job(s, job_id)
            return job is not None and job.state == JobState.QUEUED and not job.cancel_requested
