"""One scheduling pass as a pure function: which queued jobs start now, and which job capacity is held for.

Order. Tenants take turns by weighted dominant share (`TenantState.share`), lowest first, recomputed
after every job admitted in the pass (Volcano's DRF); within a tenant, highest priority then oldest
first. Priority never crosses tenants: a tenant cannot jump others by raising its priorities.

Quota. A tenant whose next job would take it past its own max_workers is set aside for the pass,
with its later jobs (priority holds within a tenant); its backlog costs one look, so it never holds
back another tenant however long it is.

Backfill. A job that does not fit now is passed over, and the jobs behind it that fit start (Kueue's
BestEffortFIFO). The first such job in fair order is the `head`.

Reservation. Passing over is bounded: the first job in fair order that does not fit and has waited
`reserve_after_s` (its tenant's, else the server's) is reserved: from then on the pass takes its
demand out of the free capacity before anyone else looks, so what frees up accumulates for it and it
starts once the running jobs that hold the rest have ended. The reservation is sticky (the scheduler
passes it back in as `reserved`) until that job starts or leaves the queue, so a changing fair order
cannot move it to another job and restart the wait. One reservation at a time: without run-time
estimates (Slurm's backfill has them) a second one could only drain the cluster further.

Cost: each queued job is looked at most once per pass, each admission costs a heap operation
over tenants: O(queued + admitted x log tenants). A tenant none of whose jobs fits what is free and
none of whose jobs can be reserved for (`QueueBounds`) costs one look, so a full cluster costs
O(tenants) per pass, and a full cluster with a reservation in place stops the walk.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from service.queueing.rows import EPS, QueueBounds, QueuedJob, Resources, TenantState


@dataclass(frozen=True)
class Waiting:
    """A job that cannot start now and what it lacks: resources free now, or workers under its quota."""

    job: QueuedJob
    cpus: float = 0.0
    gpus: float = 0.0
    workers: int = 0


@dataclass(frozen=True)
class Reservation:
    job: QueuedJob
    waited_s: float
    reserve_after_s: float


@dataclass(frozen=True)
class Plan:
    admit: tuple[QueuedJob, ...] = ()  # start these, in this order
    backfilled: frozenset[str] = frozenset()  # ids among `admit` that start ahead of `head`
    head: Waiting | None = None  # the first job in fair order that does not fit now
    reservation: Reservation | None = None
    quota_blocked: tuple[Waiting, ...] = ()  # each tenant's job held back by its max_workers
    never: tuple[tuple[QueuedJob, str], ...] = ()  # can never run on this cluster: fail them, with why


NeverFits = Callable[[QueuedJob], "str | None"]
Bounds = Callable[[str], QueueBounds]


def plan(queues: Mapping[str, Sequence[QueuedJob]], tenants: Mapping[str, TenantState], free: Resources,
         total: Resources, now: float, reserve_after_s: float, reserved: QueuedJob | None = None,
         never: NeverFits | None = None, bounds: Bounds | None = None) -> Plan:
    """`queues`: tenant id -> its queued jobs in admission order (QueueIndex.queues()). `free`: what
    is free now; `total`: the cluster's size, the shares' denominator. `reserved`: the job the last
    pass reserved for, if still queued. `never`: why a job that does not fit can never run, or None.
    `bounds`: a tenant's QueueBounds (QueueIndex.bounds), so a full cluster costs a look per tenant."""
    return _Pass(tenants, free, total, now, reserve_after_s, reserved, never, bounds).run(queues)


class _Pass:
    def __init__(self, tenants: Mapping[str, TenantState], free: Resources, total: Resources, now: float,
                 reserve_after_s: float, reserved: QueuedJob | None, never: NeverFits | None,
                 bounds: Bounds | None):
        self.tenants, self.free, self.total, self.now = dict(tenants), free, total, now
        self.reserve_after_s, self.reserved, self.never, self.bounds = reserve_after_s, reserved, never, bounds
        self.admit: list[QueuedJob] = []
        self.backfilled: set[str] = set()
        self.quota_blocked: list[Waiting] = []
        self.aside: set[str] = set()  # tenants held back by their quota for the rest of the pass
        self.failed: list[tuple[QueuedJob, str]] = []
        self.head: Waiting | None = None
        self.reservation: Reservation | None = None

    def run(self, queues: Mapping[str, Sequence[QueuedJob]]) -> Plan:
        if self.reserved is not None:
            self._consider(self.reserved, self._tenant(self.reserved.tenant_id))
        turns = [(self._tenant(tid).share(self.total), queue[0].created_at, tid)
                 for tid, queue in queues.items() if queue and tid not in self.aside]
        heapq.heapify(turns)
        at = dict.fromkeys(queues, 0)
        while turns:
            _, first, tid = heapq.heappop(turns)
            queue = queues[tid]
            if self.saturated:  # nothing more can start: only note whose quota holds them back
                self._over_quota(self._tenant(tid), queue[at[tid]])
                continue
            at[tid] = self._walk(self._tenant(tid), queue, at[tid])
            if at[tid] < len(queue) and tid not in self.aside:  # it admitted one: its share grew
                heapq.heappush(turns, (self._tenant(tid).share(self.total), first, tid))
        return Plan(tuple(self.admit), frozenset(self.backfilled), self.head, self.reservation,
                    tuple(self.quota_blocked), tuple(self.failed))

    @property
    def saturated(self) -> bool:
        """No CPU left beyond the reservation: no job can start, and the reservation is taken."""
        return self.free.empty and self.reservation is not None

    def _walk(self, tenant: TenantState, queue: Sequence[QueuedJob], i: int) -> int:
        """The tenant's jobs from position i until one is admitted (its share changed: back to the
        heap) or its quota stops it; the position to resume from."""
        if self._hopeless(tenant):  # one look: its quota, and the head if none yet
            job = next((j for j in queue[i:i + 2] if self.reserved is None or j.id != self.reserved.id), None)
            if job is not None:
                self._consider(job, tenant)
            return len(queue)
        while i < len(queue):
            job = queue[i]
            i += 1
            if self.reserved is not None and job.id == self.reserved.id:
                continue  # considered first, above
            if self._consider(job, tenant):
                return i
            if tenant.id in self.aside:
                return len(queue)
            if self.saturated:
                return i
        return i

    def _consider(self, job: QueuedJob, tenant: TenantState) -> bool:
        """Admit the job if its tenant's quota and the free capacity allow; True if admitted."""
        if self._over_quota(tenant, job):
            return False
        if self.free.covers(job.cpus, job.gpus):
            self.admit.append(job)
            if self.head is not None:
                self.backfilled.add(job.id)
            self.free = self.free.minus(job.cpus, job.gpus)
            self.tenants[tenant.id] = replace(tenant, held_cpus=tenant.held_cpus + job.cpus,
                                              held_gpus=tenant.held_gpus + job.gpus,
                                              held_workers=tenant.held_workers + job.workers)
            return True
        self._does_not_fit(job, tenant)
        return False

    def _hopeless(self, tenant: TenantState) -> bool:
        """None of the tenant's jobs fits what is free, and none can be reserved for (one is already,
        or none has waited long enough): walking its queue would change nothing."""
        if self.bounds is None:
            return False
        b = self.bounds(tenant.id)
        if b.min_cpus <= self.free.cpus + EPS and b.min_gpus <= self.free.gpus + EPS:
            return False
        return self.reservation is not None or self.now - b.oldest_queued_at < self._wait(tenant)

    def _wait(self, tenant: TenantState) -> float:
        return self.reserve_after_s if tenant.reserve_after_s is None else tenant.reserve_after_s

    def _does_not_fit(self, job: QueuedJob, tenant: TenantState) -> None:
        wait = self._wait(tenant)
        waited = self.now - job.queued_at
        is_reserved = self.reserved is not None and job.id == self.reserved.id
        starving = self.reservation is None and (is_reserved or waited >= wait)
        if self.head is not None and not starving:
            return  # passed over: backfill (a never-fitting job is found when it leads or starves)
        if self.never is not None and (why := self.never(job)):
            self.failed.append((job, why))  # it would hold up the queue for ever
            return
        if self.head is None:
            self.head = Waiting(job, max(0.0, job.cpus - self.free.cpus), max(0.0, job.gpus - self.free.gpus))
        if starving:
            self.reservation = Reservation(job, waited, wait)
            self.free = self.free.minus(job.cpus, job.gpus)  # the rest may use only what lies beyond

    def _over_quota(self, tenant: TenantState, job: QueuedJob) -> bool:
        cap = tenant.max_workers
        if cap is None or tenant.held_workers + job.workers <= cap:
            return False
        if tenant.id not in self.aside:
            self.aside.add(tenant.id)
            self.quota_blocked.append(Waiting(job, workers=tenant.held_workers + job.workers - cap))
        return True

    def _tenant(self, tenant_id: str) -> TenantState:
        return self.tenants.get(tenant_id) or TenantState(tenant_id)
