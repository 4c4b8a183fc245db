"""One sink's records delivered off the training path: a bounded queue, batches, retries, then drops.

The supervisor's run thread only enqueues (never blocks: a full queue drops the record). A
worker thread takes what has queued up as one batch, hands it to the sink, retries with
exponential backoff, and gives the batch up after the last retry. The first drop of an outage,
and any drops not yet reported when the logger closes, become a TrackingDroppedEvent, so the
job's events say what is missing.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from service.tracking.records import StepMetrics, TrackingItem
from workers.events import TrackingDroppedEvent

log = logging.getLogger("trainyard.tracking")


class Sink(Protocol):
    name: str

    def send(self, batch: list[TrackingItem]) -> None:
        """Deliver the whole batch or raise (the batch is then retried as a whole)."""

    def close(self) -> None: ...


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 3  # tries after the first, per batch
    backoff_s: float = 0.5  # before the first retry; doubles each time
    max_backoff_s: float = 8.0

    def delay(self, retry: int) -> float:
        return min(self.max_backoff_s, self.backoff_s * 2 ** retry)


@dataclass(frozen=True)
class QueueLimits:
    capacity: int = 20_000  # records waiting; beyond it new ones are dropped (hours of steps at 1 s)
    max_batch: int = 500  # records per delivery
    linger_s: float = 0.5  # after the first record, how long to wait for more to batch with it


_CLOSE = object()


class BackgroundLogger:
    def __init__(self, sink: Sink, on_dropped: Callable[[TrackingDroppedEvent], None],
                 retry: RetryPolicy = RetryPolicy(), limits: QueueLimits = QueueLimits()):
        self.sink, self.on_dropped, self.retry, self.limits = sink, on_dropped, retry, limits
        self._queue: queue.Queue = queue.Queue(maxsize=limits.capacity)
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self.delivered = self.dropped = 0  # records, over the logger's life
        self._outage: list[int] = []  # steps of records dropped since the last report
        self._outage_count, self._reported = 0, False
        self._last_error = ""
        self._thread = threading.Thread(target=self._loop, name=f"tracking-{sink.name}", daemon=True)
        self._thread.start()

    def put(self, item: TrackingItem) -> bool:
        """Queue one record; False (and counted as dropped) when the queue is full or closed."""
        if self._closing.is_set():
            return False
        try:
            self._queue.put_nowait(item)
            return True
        except queue.Full:
            self._count_dropped([item], "queue full")
            return False

    def close(self, timeout_s: float) -> None:
        """Deliver what is queued (one try per batch from now on), then stop; waits at most timeout_s."""
        deadline = time.monotonic() + timeout_s
        self._closing.set()
        try:
            self._queue.put(_CLOSE, timeout=timeout_s)
        except queue.Full:
            pass
        self._thread.join(max(0.0, deadline - time.monotonic()))
        pending = self._queue.qsize() - (1 if self._thread.is_alive() else 0)  # less the close marker
        if pending > 0:
            log.warning("%s: %d records still queued at close, dropped", self.sink.name, pending)
            self._count_dropped([], f"{pending} records still queued at close", extra=pending)
        self._report(final=True)

    # --- the worker thread ------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while (batch := self._next_batch()) is not None:
                if batch:
                    self._deliver(batch)
        finally:
            try:
                self.sink.close()
            except Exception as exc:  # a sink that cannot close must not take the supervisor down
                log.warning("%s: close failed: %r", self.sink.name, exc)

    def _next_batch(self) -> list[TrackingItem] | None:
        """Records queued now (waiting up to linger_s after the first); None once closed and drained."""
        first = self._queue.get()
        if first is _CLOSE:
            return None
        batch, deadline = [first], time.monotonic() + self.limits.linger_s
        while len(batch) < self.limits.max_batch:
            try:
                wait = 0.0 if self._closing.is_set() else max(0.0, deadline - time.monotonic())
                item = self._queue.get(timeout=wait) if wait else self._queue.get_nowait()
            except queue.Empty:
                break
            if item is _CLOSE:
                self._queue.put(_CLOSE)  # seen again once this batch is delivered
                break
            batch.append(item)
        return batch

    def _deliver(self, batch: list[TrackingItem]) -> None:
        retry = 0
        while True:
            try:
                self.sink.send(batch)
            except Exception as exc:
                self._last_error = f"{type(exc).__name__}: {exc}"[:500]
                if retry >= self.retry.retries or self._closing.is_set():
                    log.warning("%s: giving up on %d records: %s", self.sink.name, len(batch), self._last_error)
                    self._count_dropped(batch, self._last_error)
                    self._report(final=False)
                    return
                self._closing.wait(self.retry.delay(retry))  # a close cuts the backoff short
                retry += 1
                continue
            with self._lock:
                self.delivered += len(batch)
                self._reported = False  # delivered again: the next drop starts a new outage
            return

    # --- drop accounting ---------------------------------------------------------------

    def _count_dropped(self, batch: list[TrackingItem], error: str, extra: int = 0) -> None:
        with self._lock:
            n = len(batch) + extra
            self.dropped += n
            self._outage_count += n
            self._outage += [item.step for item in batch if isinstance(item, StepMetrics)]
            if not self._last_error:
                self._last_error = error

    def _report(self, final: bool) -> None:
        """The first drop of an outage at once; at close, whatever was dropped since the last report."""
        with self._lock:
            if not self._outage_count or (self._reported and not final):
                return
            event = TrackingDroppedEvent(self.sink.name, self._outage_count,
                                         (min(self._outage), max(self._outage)) if self._outage else None,
                                         self._last_error)
            self._outage, self._outage_count, self._reported = [], 0, True
        self.on_dropped(event)
