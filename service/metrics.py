"""Prometheus metrics: read from the database at scrape time, so every control-plane
replica reports the same numbers and a restart loses nothing.

This module is the catalogue's `db` part; service/metric_catalogue.py lists every series
(these and the live per-step, per-rank, per-stage and event series) and updates the live ones.

Job-level series carry a `job` label (the job id) and exist for open jobs (7 each) and the
RECENT_FINISHED most recently finished ones (4 each: state, step, loss, restarts), so the label set stays
bounded. No step label. The step time is not here: trainyard_job_step_seconds (live) has its quantiles.

/metrics is served pre-rendered (service/metrics_exposition.py): `render` returns the registry's
cached exposition, refreshed off the request path.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import or_, select

from service.db.engine import Sessions
from service.db.models import Job
from service.lifecycle import JobState
from service.metrics_exposition import exposition_of

RECENT_FINISHED = 50


class JobCollector(Collector):
    def __init__(self, sessions: Sessions):
        self.sessions = sessions

    def collect(self):
        from service.db.row_counts import jobs_by_state

        with self.sessions() as s:
            by_state = jobs_by_state(s)
            cols = (Job.id, Job.name, Job.state, Job.step, Job.total_steps, Job.loss, Job.samples_per_s,
                    Job.restarts, Job.summary)
            open_jobs = s.execute(select(*cols).where(~Job.state.in_([JobState.SUCCEEDED, JobState.FAILED,
                                                                        JobState.CANCELLED, JobState.QUEUED]))).all()
            finished = s.execute(select(*cols).where(or_(Job.state == JobState.SUCCEEDED, Job.state == JobState.FAILED,
                                                         Job.state == JobState.CANCELLED), Job.finished_at.is_not(None))
                                 .order_by(Job.finished_at.desc()).limit(RECENT_FINISHED)).all()
        states = GaugeMetricFamily("trainyard_jobs", "Jobs by lifecycle state", labels=["state"])
        for state in JobState:
            states.add_metric([state.value], by_state.get(state.value, 0))
        yield states
        yield from job_families(open_jobs, finished)
        yield from pipeline_families([*open_jobs, *finished])


# A finished job keeps its final state, step, loss and restarts (the last RECENT_FINISHED jobs only); the rest is
# about a running job (a finished job's throughput and step time are in REST).
FINISHED_KEYS = ("step", "loss", "restarts")


def job_families(open_jobs, finished) -> list[GaugeMetricFamily]:
    """The per-job families of the database's rows: 7 series per open job, 4 per finished one."""
    families = {
        "step": GaugeMetricFamily("trainyard_job_step", "Last training step stored", labels=["job", "name"]),
        "total_steps": GaugeMetricFamily("trainyard_job_total_steps", "Steps the job trains for",
                                         labels=["job", "name"]),
        "loss": GaugeMetricFamily("trainyard_job_loss", "Training loss at the last step", labels=["job", "name"]),
        "samples_per_s": GaugeMetricFamily("trainyard_job_samples_per_second",
                                           "Training throughput at the last step", labels=["job", "name"]),
        "restarts": GaugeMetricFamily("trainyard_job_restarts", "Restarts of the job so far",
                                      labels=["job", "name"]),
    }
    running = GaugeMetricFamily("trainyard_job_active", "1 while the job is starting, running or recovering",
                                labels=["job", "name"])
    state = GaugeMetricFamily("trainyard_job_state", "1 for the job's current lifecycle state",
                              labels=["job", "name", "state"])
    for row, is_open in [*((r, True) for r in open_jobs), *((r, False) for r in finished)]:
        labels = [row.id, row.name]
        for key, family in families.items():
            value = getattr(row, key)
            if value is not None and (is_open or key in FINISHED_KEYS):
                family.add_metric(labels, float(value))
        state.add_metric([*labels, str(row.state)], 1.0)
        if is_open:
            running.add_metric(labels, 1.0)
    return [*families.values(), running, state]


def pipeline_families(rows) -> list[GaugeMetricFamily]:
    """Per-stage bubble of pipeline jobs, measured (steady-state mean) and the schedule's theory.

    Read from the job summary, so a stage's series appears once the run has summarised (at its end);
    the live per-step pipeline bubble is in the job metrics API (`bubble_fraction`)."""
    measured = GaugeMetricFamily("trainyard_pipeline_bubble_fraction",
                                 "Pipeline bubble per stage: idle / step wall time, steady-state mean",
                                 labels=["job", "name", "stage"])
    theory = GaugeMetricFamily("trainyard_pipeline_bubble_fraction_theoretical",
                               "The schedule's ideal bubble per stage (balanced stages, free communication)",
                               labels=["job", "name", "stage"])
    activations = GaugeMetricFamily("trainyard_pipeline_activation_bytes_peak",
                                    "Peak bytes of activations in flight per stage (saved for backward)",
                                    labels=["job", "name", "stage"])
    for row in rows:
        pipeline = (row.summary or {}).get("pipeline") or {}
        for st in pipeline.get("stages", []):
            labels = [row.id, row.name, str(st["stage"])]
            measured.add_metric(labels, float(st["bubble_fraction"]))
            theory.add_metric(labels, float(st["bubble_fraction_theoretical"]))
            activations.add_metric(labels, float(st["activation_bytes_peak"]))
    return [measured, theory, activations]


def make_registry(sessions: Sessions) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(JobCollector(sessions))
    return registry


def render(registry: CollectorRegistry) -> bytes:
    """The registry's exposition as /metrics serves it: pre-rendered (see service/metrics_exposition.py)."""
    return exposition_of(registry).latest()
