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
`reason`, `action`, `decision`, `route`, `stat`, `quantile`). Never one label per step.

A job's series do not grow with its ranks, and stay within RUNNING_JOB_SERIES_BUDGET (docs/observability.md
has the table). Each per-rank quantity a dashboard reads (compute and communication time, straggler
score, model state, peak memory) is exported as its distribution across the job's ranks at the last
step, only the stats read (`stat` = min | median | max; RANK_QUANTITIES). Only the job's slowest ranks,
at most SLOWEST_RANKS (8) and chosen anew every step, carry a `rank` label
(`trainyard_slowest_rank_straggler_score`); a rank that leaves them loses its series. Every rank's own
numbers stay in the job's records: `GET /v1/jobs/{id}/metrics` (per-rank peak memory of the measured
steps), `GET /v1/jobs/{id}/events` (stragglers by rank and node) and the per-rank logs. Event counters
exist from their first event (no series at 0 per known cause).

Retention: a job's live gauges go when it stops being active; its event counters and last checkpoint
step stay for `TRAINYARD_METRICS_RETENTION_S` (default 600 s) more, so the final increments are
scraped, then go. Finished jobs therefore add a few series each, not a running job's.

Model FLOPs utilisation (`trainyard_job_mfu_ratio`) is exported only when the hardware peak is
known: `TRAINYARD_PEAK_FLOPS_PER_WORKER` > 0 (e.g. 989e12 for an H100 SXM at bf16 dense). It uses
the standard 6 x parameters FLOPs per token estimate (forward + backward), for GPT models only.
CPU clusters have no meaningful peak, so by default no MFU series exists.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import NamedTuple

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

STEP_WINDOW = 100  # recent step times per job behind trainyard_job_step_seconds' quantiles
STEP_QUANTILES = (0.5, 0.9, 0.99)
# The most series a running job has on /metrics (live and database parts; docs/observability.md has the
# table): 30 before its first checkpoint, 35 with one and with MFU. Per pipeline stage (5) and per event
# cause that happened (a counter each) come on top; none of it grows with the job's ranks.
RUNNING_JOB_SERIES_BUDGET = 35
QUEUE_BUCKETS = (0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 4 * 3600.0)
HTTP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
PASS_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)  # the loops tick every 0.5 s


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
       "Scheduler decisions: admitted, backfilled (started ahead of a head that does not fit), deferred (the head "
       "does not fit yet), reserved (capacity held for a starving head), preempted", ["decision"]),
    _m("trainyard_control_pass_seconds", "histogram",
       "One pass of the leader's control loops: loop=reconcile (drain every running job's supervisor, store "
       "what changed) or schedule (admit what fits)", ["loop"], buckets=PASS_BUCKETS),
    _m("trainyard_http_request_duration_seconds", "histogram", "HTTP request latency by route template",
       ["method", "route", "status"], buckets=HTTP_BUCKETS),
    # --- per job (live, from per-step records) ------------------------------------
    _m("trainyard_job_tokens_per_second", "gauge", "Tokens trained per second at the last step", ["job"]),
    _m("trainyard_job_step_seconds", "gauge",
       f"Wall time of the job's recent steps (the last {STEP_WINDOW} drained): quantile 0.5, 0.9 and 0.99",
       ["job", "quantile"]),
    _m("trainyard_job_grad_norm", "gauge", "Global gradient norm at the last step (before clipping)", ["job"]),
    _m("trainyard_job_world_size", "gauge", "Workers in the job's current layout", ["job"]),
    _m("trainyard_job_bubble_fraction", "gauge", "Pipeline bubble at the last step (mean over stages)", ["job"]),
    _m("trainyard_job_bubble_fraction_theoretical", "gauge", "The schedule's ideal pipeline bubble", ["job"]),
    _m("trainyard_skipped_steps", "counter", "Updates skipped for non-finite gradients or loss spikes", ["job"]),
    _m("trainyard_job_mfu_ratio", "gauge",
       "Model FLOPs utilisation (6 x params x tokens/s over the workers' peak); only when the peak is known",
       ["job"]),
    # --- per rank, as distributions across the job's ranks (live; 1-3 series per job whatever its ranks) --
    _m("trainyard_rank_compute_seconds", "gauge",
       "Ranks' own compute time in the last step: min, median and max across the job's ranks (stat)",
       ["job", "stat"]),
    _m("trainyard_rank_comm_seconds", "gauge",
       "Time ranks were blocked in collectives in the last step: median and max across ranks (stat)",
       ["job", "stat"]),
    _m("trainyard_straggler_score", "gauge",
       "Windowed straggler score (median compute time over ranks / the rank's: 1 typical, < threshold slow): "
       "the lowest across the job's ranks (stat=min)", ["job", "stat"]),
    _m("trainyard_straggler_threshold", "gauge", "Score below which a rank is a straggler (the job's spec)",
       ["job"]),
    _m("trainyard_rank_model_state_bytes", "gauge",
       "Parameters, gradients and optimiser state held by a rank: the most across ranks (stat=max)",
       ["job", "stat"]),
    _m("trainyard_job_expert_load_imbalance", "gauge",
       "MoE jobs: tokens routed to the busiest expert over the mean per expert in the last step, all MoE layers "
       "and ranks together (1: balanced)", ["job"]),
    _m("trainyard_job_ps_staleness", "gauge",
       "Parameter-server jobs: the stalest embedding rows a trainer read in the last step (steps of some trainer's "
       "updates they may lack; 0 under sync)", ["job"]),
    _m("trainyard_job_pipeline_staleness", "gauge",
       "pipedream / pipedream_2bw jobs: how late the gradients the last step applied were, in weight versions "
       "(2BW: 1; PipeDream: the first stage's late fraction of its micro-batches)", ["job"]),
    _m("trainyard_job_ps_rows", "gauge",
       "Parameter-server jobs: embedding rows pulled and pushed in the last step, all trainers together", ["job"]),
    _m("trainyard_rank_peak_memory_bytes", "gauge",
       "High-water mark of a rank's tensor memory during its last measured step (CUDA allocator on GPU, "
       "tracked tensor storage on CPU): the highest across the job's ranks (stat=max)", ["job", "stat"]),
    # --- the job's slowest ranks by rank (live; at most SLOWEST_RANKS per job, re-chosen every step) -----
    _m("trainyard_slowest_rank_straggler_score", "gauge",
       "Windowed straggler score of the job's slowest ranks (at most 8, the lowest scores); a rank's series "
       "goes when it leaves them", ["job", "rank"]),
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
    _m("trainyard_checkpoint_seconds", "gauge",
       "Time from starting the job's last durable checkpoint's save to durable", ["job"]),
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


class Update(NamedTuple):
    """One metric change: set a gauge, add to a counter, observe into a histogram. A named tuple, not a
    dataclass: the metrics feed makes a dozen per job and step (500 jobs: 6,000 a pass)."""

    name: str
    labels: tuple[tuple[str, str], ...]
    op: str  # set | inc | observe
    value: float = 1.0


def update(name: str, op: str, value, **labels) -> Update:
    return Update(name, tuple([(k, v if type(v) is str else str(v)) for k, v in labels.items()]), op, float(value))


ROLLBACK_CAUSES = frozenset(str(c) for c in RestartCause if c.rolls_back)
RESTART_CAUSES = tuple(str(c) for c in RestartCause)
RESIZE_REASONS = ("shrink", "grow", "relayout")
# What happened to a straggler after the policy's decision (StragglerEvent.decision) became real.
STRAGGLER_OUTCOMES: dict[type, str] = {RebalanceEvent: "rebalanced", ReplaceEvent: "replaced",
                                       StragglerRecoveredEvent: "recovered"}
STRAGGLER_ACTIONS = ("reported", "rebalance_planned", "rebalanced", "replace_planned", "replaced", "recovered")


def step_updates(job: str, rec: dict, ranks: bool = True) -> list[Update]:
    """Updates for one job-level step record (see service/supervisor/aggregate.py); with `ranks`, also its
    ranks' distributions and slowest ranks (rank_updates). The gauges keep only the last value, so of the
    records drained together only the last one's ranks need summarising (LiveMetrics does that)."""
    out = []
    for key, name in (("tokens_per_s", "trainyard_job_tokens_per_second"), ("grad_norm", "trainyard_job_grad_norm"),
                      ("expert_load_imbalance", "trainyard_job_expert_load_imbalance"),
                      ("ps_staleness", "trainyard_job_ps_staleness"), ("ps_rows", "trainyard_job_ps_rows"),
                      ("pipeline_staleness", "trainyard_job_pipeline_staleness"),
                      ("bubble_fraction", "trainyard_job_bubble_fraction"),
                      ("bubble_fraction_theoretical", "trainyard_job_bubble_fraction_theoretical")):
        value = rec.get(key)
        if value is not None and value == value and abs(value) != float("inf"):  # skip NaN/inf (skipped steps)
            out.append(update(name, "set", value, job=job))
    if rec.get("skipped") and not rec.get("partial"):
        out.append(update("trainyard_skipped_steps", "inc", 1, job=job))
    # A measured step's peaks are a job-level key: they outlive the rank entries, which a step that is not
    # the newest in the supervisor's buffer loses (record_buffer.py). CPU workers measure only steps 1-3
    # and every 100th, so a control plane that drains late must still see those steps' peaks.
    peaks = [float(p) for p in rec.get("peak_memory_bytes_per_rank") or () if _finite(p)]
    if peaks:
        out.append(update("trainyard_rank_peak_memory_bytes", "set", max(peaks), job=job, stat="max"))
    if ranks:
        out += rank_updates(job, rec.get("ranks") or ())
    for st in rec.get("stages") or ():
        stage = st["stage"]
        for key, name in (("bubble_fraction", "trainyard_stage_bubble_fraction"),
                          ("bubble_fraction_theoretical", "trainyard_stage_bubble_fraction_theoretical"),
                          ("activation_bytes_peak", "trainyard_stage_activation_bytes_in_flight"),
                          ("busy_s", "trainyard_stage_busy_seconds"), ("idle_s", "trainyard_stage_idle_seconds")):
            if st.get(key) is not None:
                out.append(update(name, "set", st[key], job=job, stage=stage))
    return out


# Per-rank quantities of a step record's `ranks` entries, the gauge that summarises each across ranks and
# the stats it keeps: only those a dashboard or alert reads (compute imbalance needs all three; a straggler
# is the lowest score; memory pressure is the highest rank). The rest of each rank's numbers is in REST.
RANK_QUANTITIES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("compute_time_s", "trainyard_rank_compute_seconds", ("min", "median", "max")),
    ("comm_time_s", "trainyard_rank_comm_seconds", ("median", "max")),
    ("straggler_score", "trainyard_straggler_score", ("min",)),
    ("model_state_bytes", "trainyard_rank_model_state_bytes", ("max",)))
STATS = ("min", "median", "max")  # the `stat` label's values (distribution's order)
SLOWEST_RANKS = 8  # the most ranks of one job that carry a `rank` label
# The families labelled by rank: the slowest ranks' value of a quantity. The set of ranks is chosen anew
# with every step; LiveMetrics removes the series of ranks that left it.
SLOWEST: tuple[tuple[str, str], ...] = (("straggler_score", "trainyard_slowest_rank_straggler_score"),)
SLOWEST_FAMILIES = tuple(name for _, name in SLOWEST)


def _finite(value) -> bool:
    return value is not None and value == value and abs(value) != float("inf")


def distribution(values: list[float]) -> tuple[float, float, float]:
    """min, median, max (the median of an even count is the mean of the middle two)."""
    ordered = sorted(values)
    n, mid = len(ordered), len(ordered) // 2
    median = ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return ordered[0], median, ordered[-1]


def slowest_ranks(ranks, k: int = SLOWEST_RANKS) -> list[dict]:
    """The k slowest of a step's rank entries: by straggler score (lowest first; the supervisor's windowed
    judgement) where the step carries scores, else by compute time, then step time (longest first)."""
    scored = any(_finite(r.get("straggler_score")) for r in ranks)

    def key(r):
        score = r.get("straggler_score")
        return (score if scored and _finite(score) else float("inf"),
                -(r.get("compute_time_s") or 0.0), -(r.get("step_time_s") or 0.0), r["rank"])

    return heapq.nsmallest(k, ranks, key=key)


def rank_updates(job: str, ranks) -> list[Update]:
    """The ranks of one step as series whose number does not grow with them: each quantity's min, median
    and max across ranks (`stat`) and the slowest ranks (at most SLOWEST_RANKS) by `rank`. Quantities no
    rank reported this step are left out (their last values stay). The peak memory is step_updates'."""
    ranks = list(ranks)
    if not ranks:
        return []
    out = []
    for key, name, stats in RANK_QUANTITIES:
        values = [float(r[key]) for r in ranks if _finite(r.get(key))]
        if values:
            for stat, value in zip(STATS, distribution(values)):
                if stat in stats:
                    out.append(update(name, "set", value, job=job, stat=stat))
    for r in slowest_ranks(ranks):
        for key, name in SLOWEST:
            if _finite(r.get(key)):
                out.append(update(name, "set", r[key], job=job, rank=r["rank"]))
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
            out.append(update("trainyard_checkpoint_seconds", "set", event.duration_s, job=job))
        if event.bytes is not None:
            out.append(update("trainyard_checkpoint_bytes", "set", event.bytes, job=job))
        return out
    return []


def layout_updates(job: str, layout: dict | None) -> list[Update]:
    if not layout:
        return []
    return [update("trainyard_job_world_size", "set", layout["world_size"], job=job)]


def mfu(tokens_per_s: float | None, params: float | None, peak_flops_per_worker: float, world: int) -> float | None:
    if not tokens_per_s or not params or peak_flops_per_worker <= 0 or world <= 0:
        return None
    return 6.0 * params * tokens_per_s / (peak_flops_per_worker * world)
