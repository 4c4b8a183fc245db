"""Admission: QUEUED jobs start when the cluster has room, in fair order across tenants, with backfill.

The policy is pure (service/queueing/): tenants take turns by weighted dominant share, a tenant's
jobs go by priority then age, a job that fits starts ahead of one that does not (backfill), and the
first job in fair order that has waited `reserve_after_s` gets a reservation, so it starts in bounded
time. A tenant held back by its own max_workers quota is set aside, never holding back others.
This module feeds the policy and carries out its decisions.

The queue lives in memory (service/queue_feed.py): each tick reads only the jobs that entered or left
QUEUED since the last one (the scheduler is woken by submits), and the whole queue, a few columns
per job, once a minute as a safety net.

Free resources are read from the cluster, minus what admitted jobs will take but do not hold yet
(a job between admission and its placement group being created, or one recovering while its group
is re-formed), so two ticks never promise the same CPUs twice.

With several control-plane replicas only the lease holder schedules (service/leases.py),
its writes fenced by the lease token; on top of that a job is claimed with
`SELECT ... FOR UPDATE SKIP LOCKED` (PostgreSQL), so a row another transaction holds
(a second scheduler, a cancel in flight) is passed over this tick, never admitted twice.

A tick commits all its admissions before it starts any supervisor (service/scheduler_launches.py):
a job's admission does not wait for the cluster calls that start the supervisors admitted before it.
A tick takes no lock the reconciler holds: each admitted job is marked `launching` in the shared
handles before its transaction commits (the mark is taken back if it is not admitted), so a reconcile
pass that reads the job STARTING finds it marked and leaves it alone; a standby supervisor it takes
stays the pool's to the orphan sweep until the commit (StandbyPool.lent). So no reconcile pass waits
for a tick's reads, cluster calls, plan or commits, nor a tick for a pass.

With TRAINYARD_PREEMPTION a tenant's job that waits (the first in fair order that does not fit, or
one its tenant's max_workers quota holds back) asks the same tenant's lower-priority running jobs to
checkpoint and requeue (service/preemption.py), once per head job and tick.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Callable, Literal

from sqlalchemy import select, update

from service import preemption
from service.cluster_port import Cluster
from service.cluster_view import Capacity, ClusterView
from service.db import repository as repo
from service.db import tenant_usage as usage_repo
from service.db import tenants as tenant_repo
from service.db.engine import SessionSource
from service.db.models import Job, utcnow
from service.lifecycle import JobState
from service.live_metrics import LiveMetrics
from service.preemption import Shortfall, choose_victims, row_of
from service.queue_feed import RESYNC_S, QueueFeed
from service.queueing import Plan, QueuedJob, Reservation, Resources, TenantState, plan
from service.restart_history import restarts_used
from service.scheduler_launches import Launch, launch_all
from service.settings import Settings
from service.supervisor.launch import Launcher
from service.supervisor_handles import Handles
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
                 handles: Handles | None = None, metrics: LiveMetrics | None = None,
                 capacity: Callable[[], Capacity | None] | None = None, cluster: Cluster | None = None,
                 resync_s: float = RESYNC_S, clock: Callable[[], float] = time.time):
        """`capacity`: the cluster's size as the control plane sees it (service/cluster_view.py); None
        reads the nodes alive now from the cluster. `resync_s`: how often the whole queue is read."""
        self.sessions, self.settings = sessions, settings
        if cluster is None:
            from service.ray_cluster import RayCluster

            cluster = RayCluster(settings)
        self.cluster = cluster
        self.capacity = capacity or (lambda: ClusterView(grace_s=0).observe(self.cluster.nodes()))
        self.metrics = metrics or LiveMetrics()
        self.launcher = launcher or Launcher(settings, cluster=cluster)
        self.handles = handles if handles is not None else Handles()  # shared with the reconciler
        self.pending: list[Launch] = []  # admitted this tick, supervisors not started yet (launch_pending)
        self.clock = clock  # "now" for how long a job has waited
        self.feed = QueueFeed(resync_s=resync_s, sessions=sessions)
        self.reserved_for: str | None = None  # the job capacity is held for (sticky across ticks)
        self._marks_checked = False  # a former leader's reserved_at marks cleared (at the first tick)

    def tick(self, launch: bool = True) -> list[str]:
        """Admit what fits now; returns the admitted job ids. Their supervisors are started after all the
        admissions are committed: here, or (launch=False) by the caller's `launch_pending`, which the
        leader's loop runs outside the launch lock so that a slow start holds up no reconcile pass."""
        try:
            return self._admit_what_fits()
        finally:
            if launch:
                self.launch_pending()

    def launch_pending(self) -> None:
        """Start the supervisors of the jobs the last ticks admitted (service/scheduler_launches.py)."""
        launches, self.pending = self.pending, []
        launch_all(self.launcher, self.sessions, self.handles, launches)

    def _admit_what_fits(self) -> list[str]:
        now = self.clock()
        with self.sessions() as s:
            self.feed.refresh(s)
            queue = self.feed.index
            if len(queue):
                tenants = self._tenants(s)
                reserved = self._reserved_not_held(repo.forming_jobs(s))
        if not len(queue):
            self._hold_for(None)
            return []
        available = self.cluster.available_resources()
        free = Resources(max(0.0, available.get("CPU", 0.0) - reserved.get("CPU", 0.0)),
                        max(0.0, available.get("GPU", 0.0) - reserved.get("GPU", 0.0)))
        total = Resources(free.cpus + sum(t.held_cpus for t in tenants.values()),
                         free.gpus + sum(t.held_gpus for t in tenants.values()))
        decision = plan(queue.queues(), tenants, free, total, now, self.settings.reserve_after_s,
                        reserved=queue.get(self.reserved_for), never=self._never_fits(), bounds=queue.bounds)
        for job, why in decision.never:
            # Accepted before the cluster's size was known, or the cluster shrank: fail it rather
            # than let it hold capacity (a reservation) or the queue's attention forever.
            if self._fail(job.id, why) or not self._still_queued(job.id):
                self.feed.drop(job.id)
        self._hold_for(decision.reservation)
        admitted = self._admit_all(decision, free)
        if decision.head is not None:
            self.metrics.decision("deferred")
        if self.settings.preemption:
            self._preempt_for(self._quota_blocked(decision))
        return admitted

    def _tenants(self, s) -> dict[str, TenantState]:
        """Every tenant's weight, quota and what its admitted jobs hold now (one aggregate query)."""
        held = usage_repo.holdings_by_tenant(s)
        return {t.id: TenantState(t.id, t.weight or 1.0, t.max_workers, t.reserve_after_s, *held.get(t.id, (0, 0, 0)))
                for t in tenant_repo.list_tenants(s)}

    def _never_fits(self) -> Callable[[QueuedJob], str | None]:
        """never_fits against the cluster's size, read once per tick and only if a job needs it."""
        seen: list[Capacity | None] = []

        def why(job: QueuedJob) -> str | None:
            if not seen:
                seen.append(self.capacity())
            if seen[0] is None:
                return None  # the cluster's size is not known yet: wait
            workers = max(1, job.workers)
            return never_fits(Demand(job.cpus, job.gpus, job.cpus / workers, job.gpus / workers), *seen[0])

        return why

    def _admit_all(self, decision: Plan, free: Resources) -> list[str]:
        """Commit every admission of the tick; their supervisors are started after (launch_pending): a job's
        admission never waits for the cluster calls that start the supervisors of the jobs admitted before it."""
        left = {"CPU": free.cpus, "GPU": free.gpus}
        admitted: list[str] = []
        launches: list[Launch] = []
        try:
            for job in decision.admit:
                ahead_of = decision.head.job.id if decision.head and job.id in decision.backfilled else None
                outcome = self._admit(job.id, left, ahead_of)
                if outcome is None:
                    continue  # held by another transaction: still queued, tried again next tick
                self.feed.drop(job.id)  # started, or no longer queued (cancelled, gone)
                if outcome:
                    left["CPU"] -= job.cpus
                    left["GPU"] -= job.gpus
                    admitted.append(job.id)
                    launches.append(outcome)  # marked launching by _admit: the reconciler leaves it alone
                    self.metrics.decision("backfilled" if ahead_of else "admitted")
        finally:  # what was committed gets its supervisor, even if a later admission raised
            self.pending.extend(launches)
        return admitted

    def _hold_for(self, reservation: Reservation | None) -> None:
        """Remember the reservation for the next tick. A change is written once: the job's `reserved_at`
        mark (GET /v1/queue) and a `reserved` event for a new one; every other mark is cleared, the last
        reservation's and, at this scheduler's first tick, any a former leader left."""
        new = reservation.job.id if reservation else None
        if new == self.reserved_for and self._marks_checked:
            return
        with self.sessions.begin() as s:  # fenced: a replica that lost the lease records nothing
            stale = update(Job).where(Job.reserved_at.is_not(None))
            s.execute((stale.where(Job.id != new) if new else stale).values(reserved_at=None))
            if reservation is not None and new != self.reserved_for:
                job = reservation.job
                s.execute(update(Job).where(Job.id == job.id).values(reserved_at=utcnow()))
                repo.add_event(s, job.id, "reserved",
                               f"capacity held for this job: it waited {reservation.waited_s:.0f}s (reserve_after_s "
                               f"{reservation.reserve_after_s:g}); jobs behind it use only what lies beyond "
                               f"{job.cpus:g} CPU / {job.gpus:g} GPU",
                               data={"waited_s": round(reservation.waited_s, 3), "cpus": job.cpus, "gpus": job.gpus})
        if reservation is not None and new != self.reserved_for:
            self.metrics.decision("reserved")
        self.reserved_for, self._marks_checked = new, True

    def _quota_blocked(self, decision: Plan) -> list[tuple]:
        """Each head job the preemption may make room for, as (Row, Shortfall): each tenant's job its
        max_workers quota holds back (the workers it lacks), and the first job in fair order that does
        not fit (the resources it lacks)."""
        waiting = [(w, Shortfall(workers=w.workers)) for w in decision.quota_blocked]
        if decision.head is not None:
            waiting.append((decision.head, Shortfall(cpus=decision.head.cpus, gpus=decision.head.gpus)))
        if not waiting:
            return []
        with self.sessions() as s:
            rows = {j.id: j for j in s.scalars(select(Job).where(Job.id.in_([w.job.id for w, _ in waiting])))}
            return [(row_of(rows[w.job.id]), short) for w, short in waiting if w.job.id in rows]

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
        held = self.cluster.created_group_owners()
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

    def _admit(self, job_id: str, free: dict[str, float],
               ahead_of: str | None = None) -> Launch | Literal[False] | None:
        """Commit the job STARTING; its supervisor is started later (launch_all). A Launch: admitted.
        False: no longer admissible (cancelled, gone). None: locked elsewhere.
        `ahead_of`: the job that does not fit and that this one starts ahead of (backfill)."""
        reservation = self.launcher.reserve()
        # Marked before the commit: a reconcile pass that reads the row STARTING finds the mark (it takes no
        # lock against this tick); taken back below if the job is not admitted after all.
        self.handles.launching(job_id)
        try:
            with self.sessions.begin() as s:  # fenced: a replica that lost the lease writes nothing
                job = self._claim(s, job_id)
                if job is None or job.cancel_requested:
                    self.launcher.release(reservation)
                    self.handles.launched(job_id, None)
                    return None if job is None and self._still_queued(job_id) else False
                created = job.created_at if job.created_at.tzinfo else job.created_at.replace(tzinfo=utcnow().tzinfo)
                self.metrics.queue_wait((utcnow() - created).total_seconds())
                backfill = f"; backfilled ahead of job {ahead_of}, which does not fit yet" if ahead_of else ""
                repo.transition(s, job, JobState.STARTING,
                                f"admitted: needs {job.cpus:g} CPU / {job.gpus:g} GPU, {free['CPU']:g} CPU free"
                                + backfill, data={"backfilled_ahead_of": ahead_of} if ahead_of else None)
                job.supervisor_epoch += 1
                job.drained_seq = 0
                job.supervisor_name = self.launcher.name(reservation, job.id, job.supervisor_epoch)
                launch = Launch(job_id, reservation, job.spec, job.supervisor_epoch, job.total_steps,
                                restarts_used(s, job.id))  # a preempted job's earlier restarts count
        except Exception:
            self.launcher.release(reservation)
            self.handles.launched(job_id, None)
            raise
        return launch

    def _still_queued(self, job_id: str) -> bool:
        with self.sessions() as s:
            job = repo.get_job(s, job_id)
            return job is not None and job.state == JobState.QUEUED and not job.cancel_requested
