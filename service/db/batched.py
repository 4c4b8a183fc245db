"""The reconciler's reads and writes for a whole pass at once: a few statements, not a few per job.

Like service/db/repository.py, each function takes a Session and leaves committing to the caller.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Protocol, cast

from sqlalchemy import Table, bindparam, select, text, tuple_, update
from sqlalchemy.orm import Session

from service.db.models import Checkpoint, Job, JobEvent, JobMetric
from service.db.repository import ACTIVE, METRIC_FIELDS, _extra_of, metric_stride

# What a pass reads of every active job: never the spec's JSON (the locked rows carry it).
ACTIVE_COLUMNS = (Job.id, Job.state, Job.drained_seq, Job.cancel_requested, Job.supervisor_name, Job.supervisor_epoch,
                  Job.restarts, Job.restarts_base, Job.layout, Job.tracking, Job.phase, Job.preempt_by,
                  Job.preempt_epoch)


def active_rows(s: Session) -> list[Any]:
    """ACTIVE_COLUMNS of every STARTING/RUNNING/RECOVERING job, oldest first (one statement)."""
    return list(s.execute(select(*ACTIVE_COLUMNS).where(Job.state.in_(ACTIVE)).order_by(Job.created_at)).all())


def specs(s: Session, job_ids: list[str]) -> dict[str, dict]:
    """Job id -> spec (lock_jobs leaves the spec out: it never changes, the reconciler keeps it)."""
    return {job_id: spec for job_id, spec in s.execute(select(Job.id, Job.spec).where(Job.id.in_(job_ids)))}


class _StepsOf(Protocol):
    """What metric_rows reads of a job: a Job, or a pass's plain row (service/db/progress_rows.py)."""

    @property
    def id(self) -> str: ...

    @property
    def total_steps(self) -> int: ...


def metric_rows(job: _StepsOf, records: list[dict], max_points: int) -> list[dict]:
    """The job_metrics rows of these step records, as repository.record_steps keeps them: every
    stride-th step and the last; a step reported twice (replayed after a restart) keeps its later record."""
    stride = metric_stride(job.total_steps, max_points)
    kept = {r["step"]: r for r in records if r["step"] % stride == 0 or r["step"] == job.total_steps}
    return [{"job_id": job.id, "step": step, "ts": r.get("ts") or 0.0, "extra": _extra_of(r),
             **{k: r.get(k) for k in METRIC_FIELDS}} for step, r in kept.items()]


def upsert_metrics(s: Session, rows: list[dict]) -> None:
    """Insert the rows, replacing a stored (job, step) (a step replayed after a restart). At most one
    row per (job, step) in `rows`. PostgreSQL: one statement over arrays of the columns; SQLite (in
    process, no round trips): an executemany."""
    if not rows:
        return
    conn = s.connection()
    if conn.dialect.name == "postgresql":
        params: dict[str, list] = {c: [_num(r.get(c)) for r in rows] for c in METRIC_FIELDS}
        params.update(job_id=[r["job_id"] for r in rows], step=[r["step"] for r in rows],
                      ts=[_num(r["ts"]) for r in rows], extra=[_json(r.get("extra")) for r in rows])
        conn.execute(_PG_UPSERT_METRICS, params)
    else:
        conn.execute(_sqlite_upsert_metrics(), [{**_NO_METRICS, **r} for r in rows])


_METRIC_ARRAYS = ", ".join(f"CAST(:{c} AS float8[])" for c in METRIC_FIELDS)
_PG_UPSERT_METRICS = text(
    f"INSERT INTO job_metrics (job_id, step, ts, extra, {', '.join(METRIC_FIELDS)}) "
    f"SELECT * FROM unnest(CAST(:job_id AS text[]), CAST(:step AS integer[]), CAST(:ts AS float8[]), "
    f"CAST(:extra AS json[]), {_METRIC_ARRAYS}) "
    f"ON CONFLICT (job_id, step) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in ("ts", "extra", *METRIC_FIELDS)))
_NO_METRICS = {k: None for k in ("extra", *METRIC_FIELDS)}


@functools.cache
def _sqlite_upsert_metrics():
    from sqlalchemy.dialects.sqlite import insert

    stmt = insert(cast(Table, JobMetric.__table__))
    return stmt.on_conflict_do_update(index_elements=["job_id", "step"],
                                      set_={c: stmt.excluded[c] for c in ("ts", "extra", *METRIC_FIELDS)})


# --- the jobs' progress: one UPDATE for all ------------------------------------

# What a drain changes on nearly every job every pass; other columns (state, summary, ...) change
# rarely and go through the ORM (repository.transition and the like).
PROGRESS = ("drained_seq", "step", "loss", "samples_per_s", "step_time_s", "restarts", "layout", "tracking",
            "last_checkpoint_step", "phase")
_PROGRESS_TYPES = {"drained_seq": "integer", "step": "integer", "loss": "float8", "samples_per_s": "float8",
                   "step_time_s": "float8", "restarts": "integer", "layout": "json", "tracking": "json",
                   "last_checkpoint_step": "integer", "phase": "json"}
_PG_UPDATE_PROGRESS = text(
    "UPDATE jobs SET " + ", ".join(f"{c} = v.{c}" for c in PROGRESS)
    + " FROM unnest(CAST(:id AS text[]), " + ", ".join(f"CAST(:{c} AS {_PROGRESS_TYPES[c]}[])" for c in PROGRESS)
    + f") AS v(id, {', '.join(PROGRESS)}) WHERE jobs.id = v.id")


def update_progress(s: Session, rows: list[dict]) -> None:
    """Progress rows ({id, *PROGRESS}) into the jobs: PostgreSQL, one statement; SQLite, an executemany."""
    if not rows:
        return
    conn = s.connection()
    if conn.dialect.name == "postgresql":
        params: dict[str, list] = {"id": [r["id"] for r in rows]}
        for c in PROGRESS:
            kind = _PROGRESS_TYPES[c]
            params[c] = [_json(r[c]) if kind == "json" else _num(r[c]) if kind == "float8" else r[c] for r in rows]
        conn.execute(_PG_UPDATE_PROGRESS, params)
    else:
        conn.execute(_sqlite_update_progress(), [{"b_id": r["id"], **{f"p_{c}": r[c] for c in PROGRESS}} for r in rows])


@functools.cache
def _sqlite_update_progress():
    table = cast(Table, Job.__table__)
    return update(table).where(table.c.id == bindparam("b_id")).values({c: bindparam(f"p_{c}") for c in PROGRESS})


def _num(value) -> float | None:
    return None if value is None else float(value)


def _json(value) -> str | None:
    return None if value is None else json.dumps(value)


def record_checkpoints(s: Session, checkpoints: list[tuple[str, int, str]]) -> None:
    """(job id, step, path) rows not stored yet: one read of those already there, one insert of the rest."""
    if not checkpoints:
        return
    wanted = {(job_id, step): path for job_id, step, path in checkpoints}
    have = {(job_id, step) for job_id, step in s.execute(
        select(Checkpoint.job_id, Checkpoint.step).where(tuple_(Checkpoint.job_id, Checkpoint.step).in_(list(wanted))))}
    s.add_all(Checkpoint(job_id=job_id, step=step, path=path) for (job_id, step), path in wanted.items()
              if (job_id, step) not in have)


def add_event_row(s: Session, job_id: str, kind: str, message: str, data: dict, ts=None) -> JobEvent:
    """repository.add_event, returning the row (its id is set once the session flushes)."""
    from service.db.models import utcnow

    row = JobEvent(job_id=job_id, kind=kind, message=message, state=None, data=data, ts=ts or utcnow())
    s.add(row)
    return row


def set_event_data(s: Session, data_by_id: dict[int, dict]) -> None:
    """Replace the `data` of these events (one executemany)."""
    if data_by_id:
        stmt = update(JobEvent).where(JobEvent.id == bindparam("event_id")).values(data=bindparam("new_data"))
        s.connection().execute(stmt, [{"event_id": i, "new_data": d} for i, d in data_by_id.items()])
