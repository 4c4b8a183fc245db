"""A reconcile pass's locked job rows as plain values, not ORM objects.

Hydrating 500 `Job` objects every pass, then telling the ORM which of their columns the bulk
UPDATE already wrote, was about half of a pass's own CPU. A pass reads and writes the same few
columns of every job; only a job whose state changes (or whose run ended) needs its ORM object,
and takes it through `JobRows.orm`, from then on written by the ORM's flush.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import String, any_, bindparam, cast, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.orm import Session, defer

from service.db.batched import PROGRESS, update_progress
from service.db.models import Job

_READ = ("state", "supervisor_epoch", "total_steps", "restarts_base")


@dataclass
class JobProgress:
    """One locked job's columns that a pass reads (state, epoch, ...) and writes (PROGRESS)."""

    id: str
    state: str
    supervisor_epoch: int
    total_steps: int
    restarts_base: int
    drained_seq: int
    step: int | None
    loss: float | None
    samples_per_s: float | None
    step_time_s: float | None
    restarts: int
    layout: Any
    tracking: Any
    last_checkpoint_step: int | None
    phase: Any

    def copy_to(self, job: Job) -> None:
        for c in PROGRESS:
            setattr(job, c, getattr(self, c))


class JobRows:
    """The pass's jobs, locked in one `SELECT ... FOR UPDATE` (in id order, as every locker of several
    job rows takes them, so two never deadlock); their progress written in one statement by `write`."""

    def __init__(self, s: Session, job_ids):
        self.s = s
        ids = sorted(set(job_ids))
        self.rows: dict[str, JobProgress] = {}
        self._orm: dict[str, Job] = {}
        if not ids:
            return
        columns = [Job.id, *(getattr(Job, c) for c in (*_READ, *PROGRESS))]
        if s.get_bind().dialect.name == "postgresql":  # one array parameter: no statement text per job count
            where = Job.id == any_(cast(bindparam("ids", ids), ARRAY(String)))
        else:
            where = Job.id.in_(ids)
        q = select(*columns).where(where).order_by(Job.id).with_for_update()
        self.rows = {row.id: JobProgress(**row._mapping) for row in s.execute(q)}

    def get(self, job_id: str) -> JobProgress | None:
        return self.rows.get(job_id)

    def orm(self, job: JobProgress) -> Job:
        """The job's ORM object (its row is locked already), with this pass's progress so far; from now
        on its progress goes out with the ORM's flush. Call `sync` after changing it through the ORM."""
        row = self._orm.get(job.id)
        if row is None:
            found = self.s.get(Job, job.id, options=[defer(Job.spec)])
            assert found is not None, f"job {job.id} is locked by this transaction"
            row = self._orm[job.id] = found
        job.copy_to(row)
        return row

    def sync(self, job: JobProgress) -> None:
        """What the ORM changed of the columns the pass reads (a transition's state)."""
        row = self._orm[job.id]
        job.state = row.state

    def write(self, jobs: list[JobProgress]) -> None:
        """Their PROGRESS columns: the ORM's jobs through their objects, the others in one statement."""
        for job in jobs:
            if job.id in self._orm:
                job.copy_to(self._orm[job.id])
        update_progress(self.s, [{"id": j.id, **{c: getattr(j, c) for c in PROGRESS}}
                                 for j in jobs if j.id not in self._orm])
