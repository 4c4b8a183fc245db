"""Preemption (opt-in, TRAINYARD_PREEMPTION): a tenant's queued job that cannot be admitted may
checkpoint and requeue the same tenant's lower-priority running jobs, never another tenant's (a
tenant must not starve others by raising its priorities).

The choice is a pure function over rows (`choose_victims`). A request is an event
`preempt_requested` on the victim naming the head job and the victim's supervisor epoch, written
in the scheduler's fenced transaction (so a replica that lost the lease writes none); the
reconciler delivers it to that epoch's supervisor every tick until the job is requeued (like a
cancel), and the supervisor ignores a request for another epoch. A victim asked and not yet
requeued counts as freeing its resources, so a head job never asks twice.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db.models import Job, JobEvent
from service.lifecycle import JobState

EPS = 1e-6
REQUESTED = "preempt_requested"


@dataclass(frozen=True)
class Row:
    """What the choice needs of a job."""

    id: str
    tenant_id: str
    priority: int
    created_at: object  # datetime; only compared
    state: str
    workers: int
    cpus: float
    gpus: float
    checkpoints: bool = True  # checkpoint.every_steps > 0: the only point where its ranks can stop early


@dataclass(frozen=True)
class Shortfall:
    """What the head job lacks: resources (cluster) and workers (its tenant's max_workers quota)."""

    cpus: float = 0.0
    gpus: float = 0.0
    workers: int = 0

    @property
    def none(self) -> bool:
        return self.cpus <= EPS and self.gpus <= EPS and self.workers <= 0


def row_of(job: Job) -> Row:
    every = (job.spec or {}).get("checkpoint", {}).get("every_steps", 0)
    return Row(job.id, job.tenant_id, job.priority, job.created_at, job.state, job.world_size, job.cpus, job.gpus,
               bool(every))


def choose_victims(head: Row, running: list[Row], short: Shortfall) -> list[Row]:
    """The fewest of the head's tenant's RUNNING, strictly lower-priority jobs, lowest priority then
    newest first, whose freed workers cover `short`; [] if nothing to free or all of them would not do.
    A job without periodic checkpoints is never chosen: it could only stop at its end."""
    if short.none:
        return []
    candidates = sorted((r for r in running if r.tenant_id == head.tenant_id and r.state == JobState.RUNNING
                         and r.priority < head.priority and r.id != head.id and r.checkpoints),
                        key=lambda r: (r.priority, _neg_time(r.created_at), r.id))
    chosen, cpus, gpus, workers = [], 0.0, 0.0, 0
    for row in candidates:
        chosen.append(row)
        cpus, gpus, workers = cpus + row.cpus, gpus + row.gpus, workers + row.workers
        if cpus + EPS >= short.cpus and gpus + EPS >= short.gpus and workers >= short.workers:
            return chosen
    return []


def _neg_time(ts) -> float:
    return -ts.timestamp()


# --- requests in the database ----------------------------------------------


def pending(s: Session, jobs: list[Job]) -> dict[str, str]:
    """Victim job id -> the head job it makes room for, for requests to the victim's current
    supervisor that are not carried out yet (the job is still running)."""
    live = {j.id: j.supervisor_epoch for j in jobs if j.state in (JobState.STARTING, JobState.RUNNING,
                                                                    JobState.RECOVERING)}
    if not live:
        return {}
    q = select(JobEvent).where(JobEvent.kind == REQUESTED, JobEvent.job_id.in_(list(live)))
    return {e.job_id: e.data["by"] for e in s.scalars(q.order_by(JobEvent.id))
            if e.data.get("epoch") == live[e.job_id]}


def request(s: Session, victim: Job, head: Row) -> None:
    from service.db import repository as repo

    repo.add_event(s, victim.id, REQUESTED,
                   f"preempting (checkpoint, then requeue) for job {head.id} of priority {head.priority}",
                   data={"by": head.id, "epoch": victim.supervisor_epoch, "priority": head.priority})


def count(s: Session, job_id: str) -> int:
    """How often the job was preempted (its `preempted` events)."""
    q = select(JobEvent.id).where(JobEvent.job_id == job_id, JobEvent.kind == "preempted")
    return len(list(s.scalars(q)))
