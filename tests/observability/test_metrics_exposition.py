"""/metrics is served pre-rendered (service/metrics_exposition.py): a scrape of an expensive registry returns
the cached text without rendering, the background refresher keeps it within its period of the data, and a
cheap registry is rendered on the scrape itself (current to the request)."""

from __future__ import annotations

import threading
import time

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from service.live_metrics import LiveMetrics
from service.metric_catalogue import update
from service.metrics import render
from service.metrics_exposition import PrerenderedExposition, exposition_of

RENDER_S = 0.3  # what one render of the "big" registry takes here (asleep: the cache is forced, inline_below_s=0)


class SlowCollector(Collector):
    """A collector that takes RENDER_S to collect, like a fleet's exposition, and counts its collections."""

    def __init__(self):
        self.collections = 0
        self.lock = threading.Lock()

    def collect(self):
        time.sleep(RENDER_S)
        with self.lock:
            self.collections += 1
        yield GaugeMetricFamily("trainyard_slow_render", "a costly collection", value=1.0)


def big_registry() -> tuple[LiveMetrics, SlowCollector]:
    live = LiveMetrics()
    slow = SlowCollector()
    live.registry.register(slow)
    return live, slow


def grad_norm(text: bytes) -> str | None:
    for line in text.decode().splitlines():
        if line.startswith('trainyard_job_grad_norm{job="j"}'):
            return line.rsplit(" ", 1)[1]
    return None


def test_a_scrape_returns_the_cache_and_the_refresher_keeps_it_fresh_within_its_period():
    live, slow = big_registry()
    period = 0.5
    exposition = PrerenderedExposition(live.registry, period_s=period, inline_below_s=0.0, idle_s=30.0)
    live.apply([update("trainyard_job_grad_norm", "set", 1.0, job="j")])
    assert grad_norm(exposition.latest()) == "1.0"  # the first scrape renders (nothing cached yet)
    live.apply([update("trainyard_job_grad_norm", "set", 2.0, job="j")])
    changed_at = time.monotonic()
    scrapes = []
    while time.monotonic() - changed_at < period + 3 * RENDER_S:
        t0 = time.monotonic()
        text = exposition.latest()
        scrapes.append(time.monotonic() - t0)
        if grad_norm(text) == "2.0":
            break
        time.sleep(0.02)
    seen_after = time.monotonic() - changed_at
    assert grad_norm(text) == "2.0", "the refresher did not render the change within its period"
    # fresh within the period plus one render (the render that started before the change may finish first)
    assert seen_after <= period + 2 * RENDER_S + 0.2, seen_after
    # no scrape rendered: each took far less than one collection, and renders ran at the refresher's pace
    assert len(scrapes) >= 3 and max(scrapes) < RENDER_S / 3, scrapes
    assert slow.collections <= 1 + (seen_after / period) + 1, (slow.collections, seen_after)


def test_the_refresher_renders_at_a_bounded_rate_and_stops_when_nobody_scrapes():
    live, slow = big_registry()
    exposition = PrerenderedExposition(live.registry, period_s=0.4, inline_below_s=0.0, idle_s=0.6)
    exposition.latest()
    time.sleep(2.0)
    # 2 s at one render per 0.4 s period at most, and none once scrapes stopped for idle_s
    assert slow.collections <= 1 + round(0.6 / 0.4) + 2, slow.collections
    before = slow.collections
    time.sleep(1.0)
    assert slow.collections == before  # idle: no more renders
    # after the idle stop, a scrape of a cache older than period + idle renders at once (no stale answer)
    live.apply([update("trainyard_job_grad_norm", "set", 3.0, job="j")])
    assert grad_norm(exposition.latest()) == "3.0"


def test_a_cheap_registry_is_rendered_on_the_scrape_and_render_uses_one_exposition_per_registry():
    live = LiveMetrics()
    for value in (1.0, 2.0, 3.0):  # each scrape sees the change just made: no refresher, no staleness
        live.apply([update("trainyard_job_grad_norm", "set", value, job="j")])
        assert grad_norm(render(live.registry)) == str(value)
    assert exposition_of(live.registry) is exposition_of(live.registry)
    assert exposition_of(live.registry)._refresher is None
    assert exposition_of(CollectorRegistry()) is not exposition_of(live.registry)
