"""/metrics pre-rendered: the exposition text of a registry, refreshed off the request path.

Rendering a fleet's exposition costs tenths of a second of CPU in the control process (20,000 series:
the database part's query, then formatting every sample). Done on each scrape, it runs on the request
thread and competes with the control loop for the interpreter at whatever rate scrapers choose. Here
one background thread per registry renders it at most every `period_s` while it is being scraped, and a
scrape returns the last text at once: a scrape never renders, and what it returns is at most
`period_s` plus one render old.

Two exceptions keep small deployments and a fresh process exact: a registry whose last render took
less than `inline_below_s` of CPU (a few jobs: milliseconds; CPU, not wall time, so a loaded host does
not switch a small registry to the cache) is rendered on the scrape itself, always current;
and the first scrape, or the first after `idle_s` without one (the refresher stops when nobody scrapes),
renders inline once and restarts the refresher.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref

from prometheus_client import CollectorRegistry, generate_latest

log = logging.getLogger("trainyard.metrics")

REFRESH_S = 5.0  # Prometheus scrapes every 15-30 s: data at most ~5 s older than the scrape
INLINE_BELOW_S = 0.05  # a render cheaper than this (CPU s) is done on the scrape (current to the request)
IDLE_S = 120.0  # no scrape for this long: the refresher stops (it costs CPU only while scraped)


class PrerenderedExposition:
    """One registry's exposition, re-rendered by a background thread every `period_s` while scraped."""

    def __init__(self, registry: CollectorRegistry, period_s: float = REFRESH_S,
                 inline_below_s: float = INLINE_BELOW_S, idle_s: float = IDLE_S):
        self._registry = weakref.ref(registry)  # the refresher must not keep a dropped plane's registry alive
        self.period_s, self.inline_below_s, self.idle_s = period_s, inline_below_s, idle_s
        self._lock = threading.Lock()
        self._text: bytes | None = None
        self.rendered_at = 0.0  # monotonic time the cached text's render started (its data is at least this new)
        self.render_s = float("inf")  # the last render's CPU time (its thread's); unknown until the first
        self.renders = 0
        self._last_scrape = 0.0
        self._refresher: threading.Thread | None = None

    def latest(self) -> bytes:
        """The exposition for a scrape: the cached text, or a fresh render where that is cheap or the cache
        is missing or stale beyond a period (the refresher was idle)."""
        now = time.monotonic()
        with self._lock:
            self._last_scrape = now
            text = self._text
            inline = (text is None or self.render_s < self.inline_below_s
                      or now - self.rendered_at > self.period_s + self.idle_s)
        if inline:
            text = self._render()
        if self.render_s >= self.inline_below_s:
            self._ensure_refresher()
        assert text is not None
        return text

    def _render(self) -> bytes:
        registry = self._registry()
        if registry is None:
            raise RuntimeError("the registry of this exposition is gone")
        started, cpu = time.monotonic(), time.thread_time()
        text = generate_latest(registry)
        took = time.thread_time() - cpu
        with self._lock:
            if started >= self.rendered_at:  # an inline render and the refresher may overlap: newest wins
                self._text, self.rendered_at = text, started
            self.render_s, self.renders = took, self.renders + 1
        return text

    def _ensure_refresher(self) -> None:
        with self._lock:
            if self._refresher is not None and self._refresher.is_alive():
                return
            self._refresher = threading.Thread(target=self._refresh, name="metrics-exposition", daemon=True)
            self._refresher.start()

    def _refresh(self) -> None:
        while True:
            with self._lock:
                wait = self.rendered_at + self.period_s - time.monotonic()
                idle = time.monotonic() - self._last_scrape > self.idle_s
            if idle or self._registry() is None:
                return  # restarted by the next scrape
            if wait > 0:
                time.sleep(wait)
                continue
            try:
                self._render()
            except Exception:  # a failed render (the database away) keeps the last text; try next period
                log.warning("rendering /metrics failed; serving the last one", exc_info=True)
                time.sleep(self.period_s)


_EXPOSITIONS: weakref.WeakKeyDictionary[CollectorRegistry, PrerenderedExposition] = weakref.WeakKeyDictionary()
_EXPOSITIONS_LOCK = threading.Lock()


def exposition_of(registry: CollectorRegistry) -> PrerenderedExposition:
    """The registry's one pre-rendered exposition (made on its first scrape)."""
    with _EXPOSITIONS_LOCK:
        exposition = _EXPOSITIONS.get(registry)
        if exposition is None:
            exposition = _EXPOSITIONS[registry] = PrerenderedExposition(registry)
        return exposition
