"""What a supervisor's drain writes to the database: state changes through the lifecycle table,
events, checkpoints, the kept step metrics and the jobs' progress, for many jobs in one transaction.

The reconciler (service/reconciler.py) gathers the drains and calls `DrainStore.store` with those
that bring something new (`has_news`); the records' sequence number is stored in the same
transaction, so a record is stored exactly once. The jobs' rows are read as plain values
(service/db/progress_rows.py); only a job whose state changes gets its ORM object.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session

from service import preemption
from service.db import batched
from service.db import repository as repo
from service.db.engine import SessionSource
from service.db.models import JobEvent
from service.db.progress_rows import JobRows
from service.lifecycle import TERMINAL, IllegalTransition, JobState
from service.settings import Settings
from workers.checkpointing import checkpoint_root, step_name
from workers.storage import Storage


@dataclass
class Stored:
    """What one job's drain stored: for after the commit."""

    records: list[dict] = field(default_factory=list)  # new to the database: the metrics see each once
    spec: dict | None = None  # None: nothing stored (an ended job, another epoch)
    finished: bool = False  # its supervisor's work is over: retire it
    checkpoints: list[tuple[JobEvent, Storage]] = field(default_factory=list)  # to size on the store


class DrainStore:
    def __init__(self, sessions: SessionSource, settings: Settings):
        self.sessions, self.settings = sessions, settings
        self.specs: dict[str, dict] = {}  # job id -> its spec (a job's spec never changes), for the metrics

    def forget_specs_but(self, known: set[str]) -> None:
        """Keep the cached specs of these jobs only (once the cache has grown past them)."""
        if len(self.specs) > 2 * len(known) + 100:
            self.specs = {job_id: spec for job_id, spec in self.specs.items() if job_id in known}

    def store(self, drains: dict[str, dict]) -> dict[str, Stored]:
        """One transaction for these drains (their supervisors' epochs checked against the rows)."""
        out = {job_id: Stored() for job_id in drains}
        with self.sessions.begin() as s:
            jobs = JobRows(s, drains)
            if missing := [job_id for job_id in jobs.rows if job_id not in self.specs]:
                self.specs.update(batched.specs(s, missing))
            metric_rows: list[dict] = []
            checkpoints: list[tuple[str, int, str]] = []
            summaries, progress = [], []
            for job_id, drained in drains.items():
                job, result = jobs.get(job_id), out[job_id]
                if job is None or job.state in TERMINAL or drained["epoch"] != job.supervisor_epoch:
                    result.finished = job is not None and job.state in TERMINAL
                    continue
                steps = []
                for rec in drained["records"]:
                    if rec["seq"] <= job.drained_seq:
                        continue
                    if rec["type"] == "state" and JobState(rec["state"]).terminal and not drained["done"]:
                        break  # the run's summary follows at once: store the end with it (next drain)
                    result.records.append(rec)
                    if rec["type"] == "state":
                        _apply_state(s, jobs.orm(job), JobState(rec["state"]), rec["message"])
                        jobs.sync(job)
                    elif rec["type"] == "event" and rec["kind"] == "checkpoint":
                        step = rec["data"]["step"]
                        job.last_checkpoint_step = step
                        where = checkpoint_root(self.settings.job_storage(job.id)) / step_name(step)
                        event = batched.add_event_row(s, job.id, rec["kind"], rec["message"], rec["data"])
                        checkpoints.append((job.id, step, where.uri))
                        result.checkpoints.append((event, where))
                    elif rec["type"] == "event":
                        repo.add_event(s, job.id, rec["kind"], rec["message"], data=rec["data"])
                    elif rec["type"] == "step":
                        steps.append(rec)
                    job.drained_seq = rec["seq"]
                if steps:
                    metric_rows += batched.metric_rows(job, steps, self.settings.metrics_max_points)
                    last = steps[-1]
                    job.step, job.loss = last["step"], last["loss"]
                    job.samples_per_s, job.step_time_s = last.get("samples_per_s"), last.get("step_time_s")
                job.restarts = job.restarts_base + drained["restarts"]
                result.spec = self.specs[job_id]
                job.layout = drained["layout"]
                if drained.get("tracking"):  # the MLflow run id appears once the run exists on the server
                    job.tracking = drained["tracking"]
                job.phase = drained.get("phase")  # None while training: the view names no phase
                if job.state == JobState.QUEUED:  # preempted: its next supervisor resumes from the checkpoint
                    orm = jobs.orm(job)
                    orm.restarts_base = job.restarts  # a preemption is not a failure: restarts carry over
                    result.finished = True  # this supervisor's work is over
                elif drained["done"] and drained["summary"] is not None:
                    summaries.append((job, drained["summary"], result))
                progress.append(job)
            jobs.write(progress)
            batched.upsert_metrics(s, metric_rows)
            batched.record_checkpoints(s, checkpoints)
            for job, summary, result in summaries:  # after the metrics: the summary reads the first one
                orm = jobs.orm(job)
                orm.summary = _complete_summary(s, orm, summary)
                orm.error = summary.get("error")
                _apply_state(s, orm, JobState(summary["state"]), orm.error or "run finished")
                result.finished = True
        return out


def _complete_summary(s: Session, job, summary: dict) -> dict:
    """A replacement supervisor only saw the steps after its resume point: fill in the job-wide view."""
    summary = dict(summary)
    first = repo.list_metrics(s, job.id, 0, 1)
    if first:
        summary["initial_loss"] = first[0].loss
    summary["steps"] = max(summary.get("steps") or 0, job.step)
    if summary.get("final_loss") is None:
        summary["final_loss"] = job.loss
    summary["restarts"] = job.restarts
    summary["preemptions"] = preemption.count(s, job.id)
    return summary

def _apply_state(s: Session, job, target: JobState, message: str) -> None:
    if target == job.state:
        return
    if target == JobState.STARTING and job.state in (JobState.RECOVERING, JobState.RUNNING):
        return  # a replacement supervisor re-forming the group: the job stays RECOVERING
    try:
        repo.transition(s, job, target, message)
    except IllegalTransition as exc:
        repo.add_event(s, job.id, "ignored_transition", str(exc), data={"from": job.state, "to": str(target)})


def has_news(row: Any, drained: dict) -> bool:
    """Whether a drain changes anything against the pass's read of the job's columns."""
    if drained["epoch"] != row.supervisor_epoch:
        return False  # an older supervisor's: ignored (the job is active, so not ended either)
    if drained["done"] and drained["summary"] is not None:
        return True
    return (any(rec["seq"] > row.drained_seq for rec in drained["records"])
            or row.restarts != row.restarts_base + drained["restarts"] or row.layout != drained["layout"]
            or bool(drained.get("tracking")) and drained["tracking"] != row.tracking
            or drained.get("phase") != row.phase)
