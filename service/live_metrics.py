"""The live part of the metrics catalogue (service/metric_catalogue.py) on one Prometheus registry:
the reconciler, the scheduler and the HTTP middleware apply their updates here; series of jobs
that ended are removed after the retention window (see the catalogue's docstring).

The values live in plain dictionaries and one collector turns them into metric families at scrape
time. Counters and histograms carry no `_created` sample: in Prometheus' text format each would be one
more series per counter, and no dashboard or alert reads them. A job's series are bounded whatever its
rank count: its ranks arrive as distributions and its slowest ranks (metric_catalogue.rank_updates); the
ranks that leave the slowest are removed here."""

from __future__ import annotations

import logging
import math
import threading
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from service.metric_catalogue import (
    CATALOGUE,
    SLOWEST_FAMILIES,
    STEP_QUANTILES,
    STEP_WINDOW,
    Metric,
    Update,
    event_updates,
    layout_updates,
    mfu,
    rank_updates,
    step_updates,
    update,
)
from workers.events import RestartEvent
from workers.spec import StragglerSpec

log = logging.getLogger("trainyard.metrics")


def _finite(value) -> bool:
    return value is not None and value == value and abs(value) != float("inf")

Labels = tuple[str, ...]


class _Histogram:
    """One histogram child: counts per bucket (not cumulative; the last is +Inf) and the sum."""

    __slots__ = ("counts", "sum")

    def __init__(self, n_buckets: int):
        self.counts = [0] * (n_buckets + 1)
        self.sum = 0.0


class LiveMetrics:
    """The catalogue's live metrics on one registry, updated from drained records; thread-safe."""

    def __init__(self, registry: CollectorRegistry | None = None, retention_s: float = 600.0,
                 peak_flops_per_worker: float = 0.0):
        self.registry = registry or CollectorRegistry(auto_describe=False)
        self.retention_s, self.peak_flops_per_worker = retention_s, peak_flops_per_worker
        self._lock = threading.Lock()
        self._catalogue: dict[str, Metric] = {m.name: m for m in CATALOGUE if m.source == "live"}
        for m in self._catalogue.values():
            assert m.kind != "histogram" or m.buckets, f"{m.name}: every histogram in CATALOGUE names its buckets"
        self._values: dict[str, dict[Labels, float | _Histogram]] = {name: {} for name in self._catalogue}
        for m in self._catalogue.values():  # a metric without labels has its one series from the start
            if not m.labels:
                self._values[m.name][()] = _Histogram(len(m.buckets or ())) if m.kind == "histogram" else 0.0
        self._job_series: dict[str, set[tuple[str, Labels]]] = {}  # job -> (metric, label values) it owns
        self._ended: dict[str, float] = {}  # job -> when it stopped being active
        self._slowest: dict[tuple[str, str], set[Labels]] = {}  # (job, family) -> the ranks' label values now
        self._step_times: dict[str, deque[float]] = {}  # job -> its last STEP_WINDOW step times (the quantiles')
        # What a job that ended keeps until the retention runs out: its event counters (so their final
        # increments are scraped) and its last checkpoint's step; its gauges go when it ends.
        self._final = {m.name for m in self._catalogue.values() if m.kind == "counter"} | {
            "trainyard_job_last_checkpoint_step"}
        self.registry.register(_Collector(self))

    def apply(self, updates: list[Update], slowest_of: str | None = None) -> None:
        """Apply updates. With `slowest_of` (a job id), the updates carry that job's slowest ranks of one
        step (metric_catalogue.rank_updates): any other rank's series of those families is removed."""
        with self._lock:
            for u in updates:
                self._apply(u)
            if slowest_of is not None:
                self._replace_slowest(slowest_of, updates)

    def _apply(self, u: Update) -> None:
        metric = self._catalogue[u.name]
        values = self._label_values(u, metric)
        children = self._values[u.name]
        # the catalogue's kind decides the op: set a gauge, inc a counter (or gauge), observe a histogram
        if u.op == "set":
            assert metric.kind == "gauge", f"{u.name}: set on a {metric.kind}"
            children[values] = u.value
        elif u.op == "inc":
            assert metric.kind in ("gauge", "counter"), f"{u.name}: inc on a {metric.kind}"
            if metric.kind == "counter" and u.value < 0:
                raise ValueError(f"{u.name}: counters only go up (inc {u.value})")
            current = children.get(values, 0.0)
            assert isinstance(current, float)
            children[values] = current + u.value
        else:
            assert metric.kind == "histogram" and metric.buckets, f"{u.name}: observe on a {metric.kind}"
            child = children.get(values)
            if child is None:
                child = children[values] = _Histogram(len(metric.buckets))
            assert isinstance(child, _Histogram)
            child.counts[bisect_left(metric.buckets, u.value)] += 1  # le: a value on a bound counts in it
            child.sum += u.value
        job = values[0] if metric.labels[:1] == ("job",) else None
        if job is not None:
            self._job_series.setdefault(job, set()).add((u.name, values))
            self._ended.pop(job, None)

    @staticmethod
    def _label_values(u: Update, metric: Metric) -> tuple[str, ...]:
        """The update's label values, its label names checked against the catalogue's."""
        if tuple([k for k, _ in u.labels]) != metric.labels:
            raise ValueError(f"{u.name}: labels {u.labels} not {metric.labels}")
        return tuple([v for _, v in u.labels])

    def _replace_slowest(self, job: str, updates: list[Update]) -> None:
        for name in SLOWEST_FAMILIES:
            now = {tuple(v for _, v in u.labels) for u in updates if u.name == name}
            for values in self._slowest.get((job, name), set()) - now:
                self._values[name].pop(values, None)
                self._job_series.get(job, set()).discard((name, values))
            if now:
                self._slowest[(job, name)] = now
            else:
                self._slowest.pop((job, name), None)

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
        updates = layout_updates(job, layout)
        if spec is not None:
            straggler = (spec.get("supervisor") or {}).get("straggler") or {}
            threshold = straggler.get("threshold", StragglerSpec.model_fields["threshold"].default)
            if straggler.get("policy") != "off":
                updates.append(update("trainyard_straggler_threshold", "set", threshold, job=job))
        last_step = last_ranks = None
        step_times: list[float] = []
        for rec in records:
            if rec["type"] == "step":
                updates += step_updates(job, rec, ranks=False)
                if _finite(rec.get("step_time_s")):
                    step_times.append(float(rec["step_time_s"]))
                last_step = rec
                if rec.get("ranks"):
                    last_ranks = rec
            elif rec["type"] == "event" and rec.get("event") is not None:  # the supervisor's typed event
                updates += event_updates(job, rec["event"])
        # The rank series are gauges of the last step: only the last record's ranks are summarised.
        if last_ranks is not None:
            updates += rank_updates(job, last_ranks["ranks"])
        # The setting overrides the peak the workers looked up from their device (none on CPU).
        peak = self.peak_flops_per_worker if self.peak_flops_per_worker > 0 else None
        if last_step is not None and peak is None:
            peak = last_step.get("peak_flops_per_s")
        if last_step is not None and peak:
            world = world_size or (layout or {}).get("world_size") or 1
            value = mfu(last_step.get("tokens_per_s"), last_step.get("model_params"), peak, world)
            if value is not None:
                updates.append(update("trainyard_job_mfu_ratio", "set", value, job=job))
        if step_times:
            updates += self._step_quantiles(job, step_times)
        self.apply(updates, slowest_of=job if last_ranks is not None else None)

    def _step_quantiles(self, job: str, step_times: list[float]) -> list[Update]:
        """The job's step-time quantiles over its last STEP_WINDOW steps: 3 gauges, not a histogram's 16."""
        with self._lock:
            window = self._step_times.setdefault(job, deque(maxlen=STEP_WINDOW))
            window.extend(step_times)
            ordered = sorted(window)
        # nearest rank: the smallest time with at least q of the window at or below it
        return [update("trainyard_job_step_seconds", "set",
                       ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))], job=job, quantile=q)
                for q in STEP_QUANTILES]

    def restarted(self, job: str, event: RestartEvent) -> None:
        """A restart the control plane itself made (a lost supervisor replaced)."""
        self.apply(event_updates(job, event))

    def queue_wait(self, seconds: float) -> None:
        self.apply([update("trainyard_queue_wait_seconds", "observe", max(0.0, seconds))])

    def control_pass(self, loop: str, seconds: float) -> None:
        self.apply([update("trainyard_control_pass_seconds", "observe", seconds, loop=loop)])

    def decision(self, decision: str, n: int = 1) -> None:
        self.apply([update("trainyard_scheduler_decisions", "inc", n, decision=decision)])

    def http(self, method: str, route: str, status: int, seconds: float) -> None:
        self.apply([update("trainyard_http_request_duration_seconds", "observe", seconds, method=method,
                           route=route, status=status)])

    def retain(self, active_jobs: set[str], now: float | None = None) -> list[str]:
        """A job no longer active keeps only its final series (event counters, last checkpoint step); those
        go once it has been inactive for the retention. Returns the jobs whose series are all gone."""
        now = time.monotonic() if now is None else now
        dropped = []
        with self._lock:
            for job in list(self._job_series):
                if job in active_jobs:
                    self._ended.pop(job, None)
                    continue
                ended = self._ended.setdefault(job, now)
                owned = self._job_series[job]
                keep = set() if now - ended >= self.retention_s else {k for k in owned if k[0] in self._final}
                for name, values in owned - keep:
                    self._values[name].pop(values, None)
                for family in SLOWEST_FAMILIES:
                    self._slowest.pop((job, family), None)
                self._step_times.pop(job, None)
                self._job_series[job] = keep
                if not keep:
                    del self._job_series[job]
                    self._ended.pop(job, None)
                    dropped.append(job)
        return dropped

    def jobs(self) -> set[str]:
        with self._lock:
            return set(self._job_series)

    def series(self) -> int:
        """How many series the live metrics expose now (a histogram child: its buckets, sum and count)."""
        with self._lock:
            return sum(len(children) * (len(self._catalogue[name].buckets or ()) + 3
                                        if self._catalogue[name].kind == "histogram" else 1)
                       for name, children in self._values.items())

    # --- scrape -----------------------------------------------------------------------

    def _snapshot(self) -> list[tuple[Metric, list[tuple[Labels, float | tuple[list[int], float]]]]]:
        """Every child's value, copied under the lock (the families are built outside it)."""
        with self._lock:
            return [(self._catalogue[name],
                     [(labels, (list(v.counts), v.sum) if isinstance(v, _Histogram) else v)
                      for labels, v in children.items()])
                    for name, children in self._values.items()]

    def families(self) -> Iterator:
        for metric, children in self._snapshot():
            if metric.kind == "histogram":
                assert metric.buckets is not None
                bounds = [floatToGoString(b) for b in metric.buckets] + ["+Inf"]
                hist = HistogramMetricFamily(metric.name, metric.help, labels=metric.labels)
                for labels, value in children:
                    assert isinstance(value, tuple)
                    counts, total = value
                    cumulative, buckets = 0, []
                    for bound, n in zip(bounds, counts):
                        cumulative += n
                        buckets.append((bound, float(cumulative)))
                    hist.add_metric(list(labels), buckets, total)
                yield hist
                continue
            family = (CounterMetricFamily if metric.kind == "counter" else GaugeMetricFamily)(
                metric.name, metric.help, labels=metric.labels)
            for labels, value in children:
                assert isinstance(value, float)
                family.add_metric(list(labels), value)
            yield family


class _Collector(Collector):
    def __init__(self, live: LiveMetrics):
        self.live = live

    def collect(self):
        return self.live.families()
