"""The metrics catalogue: every series /metrics exposes, and the updates drained records make to the
live ones (applied on a registry by service/live_metrics.py).

Two sources feed /metrics:
- `db`: read from the database at scrape time by service.metrics.JobCollector (job state, step,
  loss, samples/s, restarts, ...), so every control-plane replica reports the same numbers;
- `live`: updated in process from what the reconciler drains from supervisors (per-step records
  and events), by the scheduler (queue wait, decisions) and by the HTTP middleware. With several
  replicas, run the reconciler on one (`TRAINYARD_CONTROL_LOOPS=false` on API-only replicas) or
  aggregate with `sum`/`max by (job)`: each drained record is applied by exactly one replica.

Labels are bounded: `job` (job id), `rank`, `stage`, and short enumerations (`state`, `cause`,
`reason`, `action`, `decision`, `route`). Never one label per step.

Retention: a job's live series (per job, per rank, per stage, its event counters) stay while the
job is active and for `TRAINYARD_METRICS_RETENTION_S` (default 600 s) after it ends, so the last
values and the final increments are scraped; then they are removed. The label set is therefore
bounded by the jobs active in the last retention window.

Model FLOPs utilisation (`trainyard_job_mfu_ratio`) is exported only when the hardware peak is
known: `TRAINYARD_PEAK_FLOPS_PER_WORKER` > 0 (e.g. 989e12 for an H100 SXM at bf16 dense). It uses
the standard 6 x parameters FLOPs per token estimate (forward + backward), for GPT models only.
CPU clusters have no meaningful peak, so by default no MFU series exists.
"""

from __future__ import annotations

from dataclasses import dataclass

from workers.events import (
    CheckpointEvent,
    RebalanceEvent,
    ReplaceEvent,
    ResizeEvent,
    RestartCause,
    RestartEvent,
    RunEvent,
    StragglerEvent,
    StragglerRecoveredEvent,
)

STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CHECKPOINT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
QUEUE_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0)
HTTP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass(frozen=True)
class Metric:
    name: str  # without the _total/_bucket suffixes Prometheus adds
    kind: str  # gauge | counter | histogram
    help: str
    labels: tuple[str, ...]
    source: str = "live"  # live | db
    buckets: tuple[float, ...] | None = None


def _m(name, kind, help, labels=(), source="live", buckets=None) -> Metric:
    return Metric(name, kind, help, tuple(labels), source, buckets)


CATALOGUE: tuple[Metric, ...] = (
    # --- control plane (db: the same on every replica) ----------------------
    _m("trainyard_jobs", "gauge", "Jobs by lifecycle state", ["state"], "db"),
    _m("trainyard_job_state", "gauge", "1 for the job's current lifecycle state", ["job", "name", "state"], "db"),
    _m("trainyard_job_active", "gauge", "1 while the job is starting, running or recovering", ["job", "name"], "db"),
    _m("trainyard_job_step", "gauge", "Last training step stored", ["job", "name"], "db"),
    _m("trainyard_job_total_steps", "gauge", "Steps the job trains for", ["job", "name"], "db"),
    _m("trainyard_job_loss", "gauge", "Training loss at the last step", ["job", "name"], "db"),
    _m("trainyard_job_samples_per_second", "gauge", "Training throughput at the last step", ["job", "name"], "db"),
    _m("trainyard_job_step_time_seconds", "gauge", "Wall time of the last step", ["job", "name"], "db"),
    _m("trainyard_job_restarts", "gauge", "Restarts of the job so far", ["job", "name"], "db"),
    _m("trainyard_pipeline_bubble_fraction", "gauge",
       "Pipeline bubble per stage at the end of the run: steady-state mean of idle / step wall time",
       ["job", "name", "stage"], "db"),
    _m("trainyard_pipeline_bubble_fraction_theoretical", "gauge",
       "The schedule's ideal bubble per stage (balanced stages, free communication), at the end of the run",
       ["job", "name", "stage"], "db"),
    _m("trainyard_pipeline_activation_bytes_peak", "gauge",
       "Peak bytes of activations in flight per stage over the run", ["job", "name", "stage"], "db"),
    # --- control plane (live) ---------------------------------------------------
    _m("trainyard_queue_wait_seconds", "histogram", "Time a job waited QUEUED before the scheduler admitted it",
       buckets=QUEUE_BUCKETS),
    _m("trainyard_scheduler_decisions", "counter",
       "Scheduler decisions: admitted, or deferred (the head of the queue does not fit yet)", ["decision"]),
    _m("trainyard_http_request_duration_seconds", "histogram", "HTTP request latency by route template",
       ["method", "route", "status"], buckets=HTTP_BUCKETS),
    # --- per job (live, from per-step records) ------------------------------------
    _m("trainyard_job_tokens_per_second", "gauge", "Tokens trained per second at the last step", ["job"]),
    _m("trainyard_job_step_duration_seconds", "histogram", "Wall time of training steps (slowest rank)", ["job"],
       buckets=STEP_BUCKETS),
    _m("trainyard_job_grad_norm", "gauge", "Global gradient norm at the last step (before clipping)", ["job"]),
    _m("trainyard_job_learning_rate", "gauge", "Learning rate at the last step", ["job"]),
    _m("trainyard_job_comm_bytes_per_step", "gauge", "Logical collective bytes per rank in the last step", ["job"]),
    _m("trainyard_job_world_size", "gauge", "Workers in the job's current layout", ["job"]),
    _m("trainyard_job_layout_degree", "gauge", "Parallel degree of the current layout per dimension",
       ["job", "dim"]),
    _m("trainyard_job_bubble_fraction", "gauge", "Pipeline bubble at the last step (mean over stages)", ["job"]),
    _m("trainyard_job_bubble_fraction_theoretical", "gauge", "The schedule's ideal pipeline bubble", ["job"]),
    _m("trainyard_skipped_steps", "counter", "Updates skipped for non-finite gradients or loss spikes", ["job"]),
    _m("trainyard_job_mfu_ratio", "gauge",
       "Model FLOPs utilisation (6 x params x tokens/s over the workers' peak); only when the peak is known",
       ["job"]),
    # --- per rank (live) -------------------------------------------------------------
    _m("trainyard_rank_compute_seconds", "gauge", "Rank's own compute time in the last step", ["job", "rank"]),
    _m("trainyard_rank_comm_seconds", "gauge", "Time the rank was blocked in collectives in the last step",
       ["job", "rank"]),
    _m("trainyard_rank_step_seconds", "gauge", "Rank's wall time of the last step", ["job", "rank"]),
    _m("trainyard_rank_samples", "gauge", "Samples the rank trained in the last step (its data share)",
       ["job", "rank"]),
    _m("trainyard_straggler_score", "gauge",
       "Windowed straggler score: median compute time over ranks / this rank's (1 typical, < threshold slow)",
       ["job", "rank"]),
    _m("trainyard_straggler_threshold", "gauge", "Score below which a rank is a straggler (the job's spec)",
       ["job"]),
    _m("trainyard_rank_model_state_bytes", "gauge", "Parameters, gradients and optimiser state held by the rank",
       ["job", "rank"]),
    _m("trainyard_rank_peak_memory_bytes", "gauge",
       "High-water mark of the rank's tensor memory during its last measured step (CUDA allocator on GPU, "
       "tracked tensor storage on CPU)", ["job", "rank"]),
    _m("trainyard_rank_peak_memory_category_bytes", "gauge",
       "What the rank's last measured peak held by category (params, grads, optimizer, activations)",
       ["job", "rank", "category"]),
    # --- per pipeline stage (live) -----------------------------------------------------
    _m("trainyard_stage_bubble_fraction", "gauge", "Measured bubble (idle / pipeline makespan) at the last step",
       ["job", "stage"]),
    _m("trainyard_stage_bubble_fraction_theoretical", "gauge", "The schedule's ideal bubble for the stage",
       ["job", "stage"]),
    _m("trainyard_stage_activation_bytes_in_flight", "gauge",
       "Peak bytes of activations saved for backward in flight at the last step", ["job", "stage"]),
    _m("trainyard_stage_busy_seconds", "gauge", "Stage compute time (forward, backward, weight grad) at the last step",
       ["job", "stage"]),
    _m("trainyard_stage_idle_seconds", "gauge", "Stage idle time (waiting on neighbours) at the last step",
       ["job", "stage"]),
    # --- events (live counters) ---------------------------------------------------------
    _m("trainyard_restarts", "counter", "Worker-group restarts by cause", ["job", "cause"]),
    _m("trainyard_rollbacks", "counter",
       "Restores of the last checkpoint for numerics or integrity (non-finite, corruption)", ["job", "cause"]),
    _m("trainyard_resizes", "counter", "Elastic resizes by reason (shrink, grow, relayout)", ["job", "reason"]),
    _m("trainyard_straggler_actions", "counter",
       "Straggler decisions: reported, rebalance_planned, rebalanced, replace_planned, replaced, recovered",
       ["job", "action"]),
    _m("trainyard_checkpoints", "counter", "Durable checkpoints written", ["job"]),
    _m("trainyard_checkpoint_duration_seconds", "histogram", "Time from starting a checkpoint save to durable",
       ["job"], buckets=CHECKPOINT_BUCKETS),
    _m("trainyard_checkpoint_bytes", "gauge", "Size on disk of the job's last durable checkpoint", ["job"]),
    _m("trainyard_job_last_checkpoint_step", "gauge", "Step of the job's last durable checkpoint", ["job"]),
)

BY_NAME: dict[str, Metric] = {}
for _metric in CATALOGUE:
    BY_NAME.setdefault(_metric.name, _metric)


def exposed_names() -> set[str]:
    """Every sample name /metrics may carry (with the suffixes Prometheus clients add)."""
    names = set()
    for m in CATALOGUE:
        if m.kind == "counter":
            names |= {m.name + "_total", m.name + "_created"}
        elif m.kind == "histogram":
            names |= {m.name + s for s in ("_bucket", "_sum", "_count", "_created")}
        else:
            names.add(m.name)
    return names


# --- from drained records to metric updates ------------------------------------------


@dataclass(frozen=True)
class Update:
    """One metric change: set a gauge, add to a counter, observe into a histogram."""

    name: str
    labels: tuple[tuple[str, str], ...]
    op: str  # set | inc | observe
    value: float = 1.0


def update(name: str, op: str, value, **labels) -> Update:
    return Update(name, tuple((k, str(v)) for k, v in labels.items()), op, float(value))


ROLLBACK_CAUSES = frozenset(str(c) for c in RestartCause if c.rolls_back)
RESTART_CAUSES = tuple(str(c) for c in RestartCause)
RESIZE_REASONS = ("shrink", "grow", "relayout")
# What happened to a straggler after the policy's decision (StragglerEvent.decision) became real.
STRAGGLER_OUTCOMES: dict[type, str] = {RebalanceEvent: "rebalanced", ReplaceEvent: "replaced",
                                       StragglerRecoveredEvent: "recovered"}
STRAGGLER_ACTIONS = ("reported", "rebalance_planned", "rebalanced", "replace_planned", "replaced", "recovered")


def zero_counters(job: str) -> list[Update]:
    """A new job's event counters at 0, so the first event is an increase() and panels show zeros, not gaps.
    (The bounded label values are listed above; a cause outside them still counts, from 1.)"""
    out = [update("trainyard_restarts", "inc", 0, job=job, cause=c) for c in RESTART_CAUSES]
    out += [update("trainyard_rollbacks", "inc", 0, job=job, cause=c) for c in sorted(ROLLBACK_CAUSES)]
    out += [update("trainyard_resizes", "inc", 0, job=job, reason=r) for r in RESIZE_REASONS]
    out += [update("trainyard_straggler_actions", "inc", 0, job=job, action=a) for a in STRAGGLER_ACTIONS]
    out += [update("trainyard_checkpoints", "inc", 0, job=job), update("trainyard_skipped_steps", "inc", 0, job=job)]
    return out


def step_updates(job: str, rec: dict) -> list[Update]:
    """Updates for one job-level step record (see service/supervisor/aggregate.py)."""
    out = []
    for key, name in (("tokens_per_s", "trainyard_job_tokens_per_second"), ("grad_norm", "trainyard_job_grad_norm"),
                      ("lr", "trainyard_job_learning_rate"), ("comm_bytes", "trainyard_job_comm_bytes_per_step"),
                      ("bubble_fraction", "trainyard_job_bubble_fraction"),
                      ("bubble_fraction_theoretical", "trainyard_job_bubble_fraction_theoretical")):
        value = rec.get(key)
        if value is not None and value == value and abs(value) != float("inf"):  # skip NaN/inf (skipped steps)
            out.append(update(name, "set", value, job=job))
    if rec.get("step_time_s") is not None:
        out.append(update("trainyard_job_step_duration_seconds", "observe", rec["step_time_s"], job=job))
    if rec.get("skipped") and not rec.get("partial"):
        out.append(update("trainyard_skipped_steps", "inc", 1, job=job))
    for r in rec.get("ranks") or ():
        rank = r["rank"]
        for key, name in (("compute_time_s", "trainyard_rank_compute_seconds"),
                          ("comm_time_s", "trainyard_rank_comm_seconds"),
                          ("step_time_s", "trainyard_rank_step_seconds"), ("samples", "trainyard_rank_samples"),
                          ("straggler_score", "trainyard_straggler_score"),
                          ("model_state_bytes", "trainyard_rank_model_state_bytes"),
                          ("peak_memory_bytes", "trainyard_rank_peak_memory_bytes")):
            if r.get(key) is not None:
                out.append(update(name, "set", r[key], job=job, rank=rank))
        for category, nbytes in (r.get("peak_memory_breakdown") or {}).items():
            out.append(update("trainyard_rank_peak_memory_category_bytes", "set", nbytes, job=job, rank=rank,
                              category=category))
    for st in rec.get("stages") or ():
        stage = st["stage"]
        for key, name in (("bubble_fraction", "trainyard_stage_bubble_fraction"),
                          ("bubble_fraction_theoretical", "trainyard_stage_bubble_fraction_theoretical"),
                          ("activation_bytes_peak", "trainyard_stage_activation_bytes_in_flight"),
                          ("busy_s", "trainyard_stage_busy_seconds"), ("idle_s", "trainyard_stage_idle_seconds")):
            if st.get(key) is not None:
                out.append(update(name, "set", st[key], job=job, stage=stage))
    return out


def event_updates(job: str, event: RunEvent) -> list[Update]:
    """Updates for one supervisor event (restart, resize, straggler, checkpoint, ...): labels from its fields."""
    if isinstance(event, RestartEvent):
        out = [update("trainyard_restarts", "inc", 1, job=job, cause=event.cause)]
        if event.cause.rolls_back:
            out.append(update("trainyard_rollbacks", "inc", 1, job=job, cause=event.cause))
        return out
    if isinstance(event, ResizeEvent):
        return [update("trainyard_resizes", "inc", 1, job=job, reason=event.direction)]
    if isinstance(event, StragglerEvent):
        return [update("trainyard_straggler_actions", "inc", 1, job=job, action=event.decision)]
    action = STRAGGLER_OUTCOMES.get(type(event))
    if action is not None:
        return [update("trainyard_straggler_actions", "inc", 1, job=job, action=action)]
    if isinstance(event, CheckpointEvent):
        out = [update("trainyard_checkpoints", "inc", 1, job=job),
               update("trainyard_job_last_checkpoint_step", "set", event.step, job=job)]
        if event.duration_s is not None:
            out.append(update("trainyard_checkpoint_duration_seconds", "observe", event.duration_s, job=job))
        if event.bytes is not None:
            out.append(update("trainyard_checkpoint_bytes", "set", event.bytes, job=job))
        return out
    return []


def layout_updates(job: str, layout: dict | None) -> list[Update]:
    if not layout:
        return []
    out = [update("trainyard_job_world_size", "set", layout["world_size"], job=job)]
    for dim in ("dp", "tp", "pp"):
        if layout.get(dim) is not None:
            out.append(update("trainyard_job_layout_degree", "set", layout[dim], job=job, dim=dim))
    return out


def mfu(tokens_per_s: float | None, params: float | None, peak_flops_per_worker: float, world: int) -> float | None:
    if not tokens_per_s or not params or peak_flops_per_worker <= 0 or world <= 0:
        return None
    return 6.0 * params * tokens_per_s / (peak_flops_per_worker * world)
