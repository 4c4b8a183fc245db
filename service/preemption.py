"""Preemption (opt-in, TRAINYARD_PREEMPTION): a tenant's queued job that cannot be admitted may
checkpoint and requeue the same tenant's lower-priority running jobs, never another tenant's (a
tenant must not starve others by raising its priorities).

The choice is a pure function over rows (`choose_victims`). A request is written on the victim's
row (`preempt_by`, `preempt_epoch`: the head job and the victim's supervisor epoch), beside an event
`preempt_requested` for its history, in the scheduler's fenced transaction (so a replica that lost
the lease writes none); the reconciler delivers it to that epoch's supervisor every pass until the
job is requeued (like a cancel), and the supervisor ignores a request for another epoch. A request
is pending while the epoch it names is the job's: the next supervisor (after the requeue) has a new
one, so nothing needs clearing, and finding the pending ones reads no events (the row is read anyway).
A victim asked and not yet requeued counts as freeing its resources, so a head job never asks twice.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db.models import Job, JobEvent
from service.lifecycle import JobState

EPS = 1e-6
REQUESTED = "preempt_requested"
LIVE = (JobState.STARTING, JobState.RUNNING, JobState.RECOVERING)


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


class Requestable(Protocol):
    """What `pending` reads of a job: a Job, or a row of its columns (service/db/batched.py)."""

    @property
    def id(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def supervisor_epoch(self) -> int: ...
    @property
    def preempt_by(self) -> str | None: ...
    @property
    def preempt_epoch(self) -> int | None: ...


def pending(s: Session | None, jobs: Iterable[Requestable]) -> dict[str, str]:
    """Victim job id -> the head job it makes room for, for requests to the victim's current
    supervisor that are not carried out yet (the job is still running). Reads only the jobs' own
    columns: no query (`s` is kept for the callers that pass their session)."""
    return {j.id: j.preempt_by for j in jobs
            if j.state in LIVE and j.preempt_by is not None and j.preempt_epoch == j.supervisor_epoch}


def request(s: Session, victim: Job, head: Row) -> None:
    from service.db import repository as repo

    victim.preempt_by, victim.preempt_epoch = head.id, victim.supervisor_epoch
    repo.add_event(s, victim.id, REQUESTED,
                   f"preempting (checkpoint, then requeue) for job {head.id} of priority {head.priority}",
                   data={"by": head.id, "epoch": victim.supervisor_epoch, "priority": head.priority})


def count(s: Session, job_id: str) -> int:
    """How often the job was preempted (its `preempted` events)."""
    q = select(JobEvent.id).where(JobEvent.job_id == job_id, JobEvent.kind == "preempted")
    return len(list(s.scalars(q)))
