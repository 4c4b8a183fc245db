"""The live part of the metrics catalogue (service/metric_catalogue.py) on one Prometheus registry:
the reconciler, the scheduler and the HTTP middleware apply their updates here; series of jobs
that ended are removed after the retention window (see the catalogue's docstring)."""

from __future__ import annotations

import logging
import threading
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from service.metric_catalogue import (
    CATALOGUE,
    Update,
    event_updates,
    layout_updates,
    mfu,
    step_updates,
    update,
    zero_counters,
)
from workers.events import RestartEvent
from workers.spec import StragglerSpec

log = logging.getLogger("trainyard.metrics")


class LiveMetrics:
    """The catalogue's live metrics on one registry, updated from drained records; thread-safe."""

    def __init__(self, registry: CollectorRegistry | None = None, retention_s: float = 600.0,
                 peak_flops_per_worker: float = 0.0):
        self.registry = registry or CollectorRegistry(auto_describe=False)
        self.retention_s, self.peak_flops_per_worker = retention_s, peak_flops_per_worker
        self._lock = threading.Lock()
        self._metrics: dict[str, Gauge | Counter | Histogram] = {}
        self._job_series: dict[str, set[tuple[str, tuple]]] = {}  # job -> (metric, label values) it owns
        self._ended: dict[str, float] = {}  # job -> when it stopped being active
        for m in CATALOGUE:
            if m.source != "live":
                continue
            if m.kind == "gauge":
                self._metrics[m.name] = Gauge(m.name, m.help, labelnames=m.labels, registry=self.registry)
            elif m.kind == "counter":
                self._metrics[m.name] = Counter(m.name, m.help, labelnames=m.labels, registry=self.registry)
            else:
                assert m.buckets is not None, f"{m.name}: every histogram in CATALOGUE names its buckets"
                self._metrics[m.name] = Histogram(m.name, m.help, labelnames=m.labels, registry=self.registry,
                                                  buckets=m.buckets)

    def apply(self, updates: list[Update]) -> None:
        with self._lock:
            for u in updates:
                metric = self._metrics[u.name]
                values = tuple(v for _, v in u.labels)
                child = metric.labels(*values) if values else metric
                # the catalogue's kind decides the op: set a gauge, inc a counter (or gauge), observe a histogram
                if u.op == "set":
                    assert isinstance(child, Gauge), f"{u.name}: set on a {type(child).__name__}"
                    child.set(u.value)
                elif u.op == "inc":
                    assert isinstance(child, (Gauge, Counter)), f"{u.name}: inc on a {type(child).__name__}"
                    child.inc(u.value)
                else:
                    assert isinstance(child, Histogram), f"{u.name}: observe on a {type(child).__name__}"
                    child.observe(u.value)
                job = dict(u.labels).get("job")
                if job is not None:
                    self._job_series.setdefault(job, set()).add((u.name, values))
                    self._ended.pop(job, None)

    # --- what the control plane calls -------------------------------------------------

    def drained(self, job: str, records: list[dict], layout: dict | None = None, spec: dict | None = None,
                world_size: int | None = None) -> None:
        """Newly stored supervisor records of one job (each record is applied once). Never raises:
        a malformed record costs its metrics, not the reconciler's tick."""
        try:
            self._drained(job, records, layout, spec, world_size)
        except Exception:
            log.exception("metrics from the records of job %s", job)

    def _drained(self, job, records, layout, spec, world_size) -> None:
        updates = [] if job in self.jobs() else zero_counters(job)
        updates += layout_updates(job, layout)
        if spec is not None:
            straggler = (spec.get("supervisor") or {}).get("straggler") or {}
            threshold = straggler.get("threshold", StragglerSpec.model_fields["threshold"].default)
            if straggler.get("policy") != "off":
                updates.append(update("trainyard_straggler_threshold", "set", threshold, job=job))
        last_step = None
        for rec in records:
            if rec["type"] == "step":
                updates += step_updates(job, rec)
                last_step = rec
            elif rec["type"] == "event" and rec.get("event") is not None:  # the supervisor's typed event
                updates += event_updates(job, rec["event"])
        # The setting overrides the peak the workers looked up from their device (none on CPU).
        peak = self.peak_flops_per_worker if self.peak_flops_per_worker > 0 else None
        if last_step is not None and peak is None:
            peak = last_step.get("peak_flops_per_s")
        if last_step is not None and peak:
            world = world_size or (layout or {}).get("world_size") or 1
            value = mfu(last_step.get("tokens_per_s"), last_step.get("model_params"), peak, world)
            if value is not None:
                updates.append(update("trainyard_job_mfu_ratio", "set", value, job=job))
        self.apply(updates)

    def restarted(self, job: str, event: RestartEvent) -> None:
        """A restart the control plane itself made (a lost supervisor replaced)."""
        self.apply(([] if job in self.jobs() else zero_counters(job)) + event_updates(job, event))

    def queue_wait(self, seconds: float) -> None:
        self._histogram("trainyard_queue_wait_seconds").observe(max(0.0, seconds))

    def decision(self, decision: str, n: int = 1) -> None:
        self._counter("trainyard_scheduler_decisions").labels(decision).inc(n)

    def http(self, method: str, route: str, status: int, seconds: float) -> None:
        self._histogram("trainyard_http_request_duration_seconds").labels(method, route, str(status)).observe(seconds)

    def _histogram(self, name: str) -> Histogram:
        metric = self._metrics[name]
        assert isinstance(metric, Histogram), f"{name} is a {type(metric).__name__} in CATALOGUE"
        return metric

    def _counter(self, name: str) -> Counter:
        metric = self._metrics[name]
        assert isinstance(metric, Counter), f"{name} is a {type(metric).__name__} in CATALOGUE"
        return metric

    def retain(self, active_jobs: set[str], now: float | None = None) -> list[str]:
        """Drop the series of jobs inactive for longer than the retention; returns the jobs dropped."""
        now = time.monotonic() if now is None else now
        dropped = []
        with self._lock:
            for job in list(self._job_series):
                if job in active_jobs:
                    self._ended.pop(job, None)
                    continue
                ended = self._ended.setdefault(job, now)
                if now - ended >= self.retention_s:
                    for name, values in self._job_series.pop(job):
                        try:
                            self._metrics[name].remove(*values)
                        except KeyError:
                            pass
                    self._ended.pop(job, None)
                    dropped.append(job)
        return dropped

    def jobs(self) -> set[str]:
        with self._lock:
            return set(self._job_series)
