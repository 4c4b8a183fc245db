"""Jobs in the database: submitting one (idempotency keys, the open-jobs quota), reading and
listing jobs, moving them along the lifecycle with their events, the scheduler's reads of the
queue, and each job's step metrics and checkpoints. Tenants and tokens are in
service/db/tenants.py, tenants' usage in service/db/tenant_usage.py, the audit log in
service/db/audit_log.py, row counts in service/db/row_counts.py.

Each function takes a Session and leaves committing to the caller's unit of
work (`with sessions.begin():`), so a rejected request writes nothing.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime, timezone

from sqlalchemy import bindparam, delete, func, select
from sqlalchemy.orm import Session

from service.db.models import Checkpoint, Job, JobEvent, JobMetric, utcnow
from service.lifecycle import TERMINAL, JobState, check_transition
from service.rank_times import rank_times
from service.refusals import Conflict, OverQuota
from workers.spec import JobSpec

ACTIVE = (JobState.STARTING, JobState.RUNNING, JobState.RECOVERING)
METRIC_FIELDS = ("loss", "step_time_s", "samples_per_s", "tokens_per_s", "grad_norm", "lr", "comm_bytes",
                 "bubble_fraction")

# What a pipeline step's metric point keeps of each stage's report (workers/parallel/pipeline/stage_meter.py).
STAGE_POINT_FIELDS = ("stage", "forward_s", "backward_s", "weight_grad_s", "comm_s", "other_s", "idle_s",
                      "wall_s", "bubble_fraction")

# The refusals this module raises, under the names its callers know them by.
QuotaExceeded = OverQuota
IdempotencyConflict = Conflict


def aware(ts: datetime | None) -> datetime | None:
    """SQLite hands back naive UTC; make it comparable with aware times."""
    return ts.replace(tzinfo=timezone.utc) if ts is not None and ts.tzinfo is None else ts


# --- jobs ------------------------------------------------------------------


def find_by_idempotency_key(s: Session, tenant_id: str, key: str) -> Job | None:
    """Also a job this transaction added and has not flushed yet (an earlier submit of the same
    group-commit batch): not flushing here lets the batch's inserts go out together at commit."""
    for obj in s.new:
        if isinstance(obj, Job) and obj.tenant_id == tenant_id and obj.idempotency_key == key:
            return obj
    prefetched = s.info.get("idempotency_keys", {})
    if (tenant_id, key) in prefetched:
        return prefetched[(tenant_id, key)]
    # A Core query for the id (a miss is the common case and costs no ORM loading), then the job.
    job_id = s.connection().execute(_JOB_BY_KEY, {"tenant_id": tenant_id, "key": key}).scalar()
    return s.get(Job, job_id) if job_id is not None else None


_JOB_BY_KEY = select(Job.id).where(Job.tenant_id == bindparam("tenant_id"), Job.idempotency_key == bindparam("key"))


def prefetch_idempotency_keys(s: Session, pairs: list[tuple[str, str]]) -> None:
    """find_by_idempotency_key's answer for each (tenant id, key), in one query (on the unique
    index's columns) for all: later lookups of these keys in this transaction need none."""
    wanted = set(pairs)
    if not wanted:
        return
    rows = s.execute(select(Job.id, Job.tenant_id, Job.idempotency_key).where(
        Job.tenant_id.in_({t for t, _ in wanted}), Job.idempotency_key.in_({k for _, k in wanted}))).all()
    hits = {(tenant_id, key): job_id for job_id, tenant_id, key in rows if (tenant_id, key) in wanted}
    jobs = {job.id: job for job in s.scalars(select(Job).where(Job.id.in_(hits.values())))} if hits else {}
    found = s.info.setdefault("idempotency_keys", {})
    for pair in pairs:
        job_id = hits.get(pair)
        found[pair] = jobs.get(job_id) if job_id is not None else None


def count_open_jobs(s: Session, tenant_id: str) -> int:
    open_states = [JobState.QUEUED, *ACTIVE]
    return s.scalar(select(func.count()).select_from(Job)
                    .where(Job.tenant_id == tenant_id, Job.state.in_(open_states))) or 0


def quota_message(limit: int) -> str:
    return f"tenant has {limit} queued or running jobs (the limit); wait for some to finish or cancel them"


def create_job(s: Session, tenant_id: str, spec: JobSpec, priority: int, body_sha256: str,
               idempotency_key: str | None, max_open_jobs: int | None) -> Job:
    """A QUEUED job and its first event. max_open_jobs=None: the caller checked the quota already."""
    if max_open_jobs is not None and count_open_jobs(s, tenant_id) >= max_open_jobs:
        raise QuotaExceeded(quota_message(max_open_jobs))
    r = spec.resources
    now = utcnow()  # at the submit, not at the (possibly later, batched) flush: FIFO order holds
    job = Job(id=uuid.uuid4().hex[:16], tenant_id=tenant_id, created_at=now, updated_at=now, queued_at=now,
              name=spec.name,
              spec=spec.model_dump(mode="json"), state=JobState.QUEUED, priority=priority, world_size=spec.world_size,
              cpus=r.cpus_per_worker * spec.world_size, gpus=r.gpus_per_worker * spec.world_size,
              total_steps=spec.total_steps, idempotency_key=idempotency_key, body_sha256=body_sha256)
    s.add(job)  # flushed with the rest of the transaction (its id is already set)
    add_event(s, job.id, "state", "job accepted", state=JobState.QUEUED, data={"to": "QUEUED"})
    return job


def get_job(s: Session, job_id: str, tenant_id: str | None = None, lock: bool = False) -> Job | None:
    if "\x00" in job_id:  # no job's id: a 404, not PostgreSQL's refusal of the text
        return None
    q = select(Job).where(Job.id == job_id)
    if tenant_id is not None:
        q = q.where(Job.tenant_id == tenant_id)
    if lock:
        q = q.with_for_update()
    return s.scalar(q)


def list_jobs(s: Session, tenant_id: str, state: str | None, limit: int, offset: int) -> list[Job]:
    q = select(Job).where(Job.tenant_id == tenant_id)
    if state:
        q = q.where(Job.state == state)
    return list(s.scalars(q.order_by(Job.created_at.desc(), Job.id).limit(limit).offset(offset)))


def queued_jobs(s: Session, limit: int = 1000) -> list[Job]:
    """The queue in admission order: highest priority first, then first come first served."""
    q = select(Job).where(Job.state == JobState.QUEUED, Job.cancel_requested.is_(False))
    return list(s.scalars(q.order_by(Job.priority.desc(), Job.created_at, Job.id).limit(limit)))


def active_jobs(s: Session) -> list[Job]:
    return list(s.scalars(select(Job).where(Job.state.in_(ACTIVE)).order_by(Job.created_at)))


def transition(s: Session, job: Job, target: JobState, message: str, data: dict | None = None) -> None:
    """Move a job along the lifecycle table (IllegalTransition otherwise) and record it as an event."""
    previous = job.state
    job.state = check_transition(job.state, target)
    now = utcnow()
    job.updated_at = now
    if target == JobState.STARTING and job.started_at is None:
        job.started_at = now
    if target == JobState.QUEUED:  # requeued (preempted): the scheduler's incremental read finds it by this
        job.queued_at = now
    if target in TERMINAL:
        job.finished_at = now
    add_event(s, job.id, "state", message, state=target,
              data={"from": str(previous), "to": str(target), **(data or {})})


def request_cancel(s: Session, job: Job) -> None:
    """QUEUED jobs are cancelled at once; running ones are flagged for the reconciler to stop."""
    if job.state == JobState.QUEUED:
        transition(s, job, JobState.CANCELLED, "cancelled by user before it started")
        return
    check_transition(job.state, JobState.CANCELLED)  # 409 for a terminal job
    if not job.cancel_requested:
        job.cancel_requested = True
        job.updated_at = utcnow()
        add_event(s, job.id, "cancel_requested", "cancel requested by user")


# --- the scheduler's queue index (service/queue_feed.py) --------------------

# What the scheduler orders and fits a queued job by: never the spec's JSON.
QUEUE_COLUMNS = (Job.id, Job.tenant_id, Job.priority, Job.created_at, Job.queued_at, Job.world_size, Job.cpus,
                 Job.gpus)


def queue_rows(s: Session, since: datetime | None = None) -> list:
    """Every QUEUED job's QUEUE_COLUMNS, or only those that entered QUEUED at or after `since`."""
    q = select(*QUEUE_COLUMNS).where(Job.state == JobState.QUEUED, Job.cancel_requested.is_(False))
    if since is not None:
        q = q.where(Job.queued_at >= since)
    return list(s.execute(q).all())


def ended_since(s: Session, since: datetime) -> list[str]:
    """Ids of the jobs that ended (cancelled, failed, finished) at or after `since`."""
    return list(s.scalars(select(Job.id).where(Job.finished_at >= since)))


def forming_jobs(s: Session) -> list:
    """STARTING and RECOVERING jobs (id, state, supervisor_epoch, cpus, gpus): those whose placement
    group may not hold its resources yet."""
    return list(s.execute(select(Job.id, Job.state, Job.supervisor_epoch, Job.cpus, Job.gpus)
                          .where(Job.state.in_((JobState.STARTING, JobState.RECOVERING)))).all())


# --- events, metrics, checkpoints -----------------------------------------


def add_event(s: Session, job_id: str, kind: str, message: str, state: str | None = None,
              data: dict | None = None, ts=None) -> None:
    s.add(JobEvent(job_id=job_id, kind=kind, message=message, state=state, data=data or {}, ts=ts or utcnow()))


def list_events(s: Session, job_id: str, after_id: int, limit: int) -> list[JobEvent]:
    q = select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.id > after_id)
    return list(s.scalars(q.order_by(JobEvent.id).limit(limit)))


def metric_stride(total_steps: int, max_points: int) -> int:
    """Keep every k-th step so a job stores at most ~max_points rows, whatever its length."""
    return max(1, -(-total_steps // max_points))


def record_steps(s: Session, job: Job, records: Iterable[dict], max_points: int) -> None:
    stride = metric_stride(job.total_steps, max_points)
    # A step replayed after a restart from a checkpoint replaces the row it had, and its first run's
    # record when both arrive in one batch (the later record of a step wins).
    kept = {r["step"]: r for r in records if r["step"] % stride == 0 or r["step"] == job.total_steps}
    if not kept:
        return
    s.execute(delete(JobMetric).where(JobMetric.job_id == job.id, JobMetric.step.in_(list(kept))))
    s.add_all(JobMetric(job_id=job.id, step=step, ts=r.get("ts") or 0.0,
                        extra=_extra_of(r), **{k: r.get(k) for k in METRIC_FIELDS}) for step, r in kept.items())


def _extra_of(record: dict) -> dict | None:
    """The point's JSON beyond the columns: a program's own metrics and, on a step whose memory was measured,
    each rank's peak and its breakdown (workers/step_memory.py)."""
    extra = dict(record.get("metrics") or {})
    # MoE jobs; validation; MFU (GPU); compressed DDP (what its fp32 all-reduce would have sent)
    for key in ("expert_tokens", "expert_load_imbalance", "val_loss", "mfu", "comm_bytes_uncompressed"):
        if record.get(key) is not None:
            extra[key] = record[key]
    extra.update(rank_times(record))  # each rank's step and compute time, jobs up to 256 ranks (the console)
    if record.get("stages"):  # pipeline jobs: each stage's blocks of the step (the console's timeline)
        extra["stages"] = [{k: st.get(k) for k in STAGE_POINT_FIELDS} for st in record["stages"]]
    if record.get("peak_memory_bytes_per_rank"):
        extra["peak_memory_bytes_per_rank"] = record["peak_memory_bytes_per_rank"]
        # a step the supervisor's buffer thinned carries the breakdowns alone (record_buffer.py)
        extra["peak_memory_breakdown_per_rank"] = record.get("peak_memory_breakdown_per_rank") or [
            r.get("peak_memory_breakdown") for r in record.get("ranks", ())]
    return extra or None


def list_metrics(s: Session, job_id: str, after_step: int, limit: int) -> list[JobMetric]:
    q = select(JobMetric).where(JobMetric.job_id == job_id, JobMetric.step > after_step)
    return list(s.scalars(q.order_by(JobMetric.step).limit(limit)))


def record_checkpoint(s: Session, job_id: str, step: int, path: str) -> None:
    exists = s.scalar(select(Checkpoint.id).where(Checkpoint.job_id == job_id, Checkpoint.step == step))
    if exists is None:
        s.add(Checkpoint(job_id=job_id, step=step, path=path))


def list_checkpoints(s: Session, job_id: str) -> list[Checkpoint]:
    return list(s.scalars(select(Checkpoint).where(Checkpoint.job_id == job_id).order_by(Checkpoint.step)))
