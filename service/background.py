"""A daemon thread that runs queued work in batches, in the order it was submitted.

The reconciler hands it what must follow a pass's commit but need not hold up the next pass:
feeding the stored records to the live metrics, listing checkpoint sizes on the store.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger("trainyard.background")
T = TypeVar("T")


class Background(Generic[T]):
    """`run(batch)` on a thread of its own for what `submit` queued, oldest first. Past `max_pending`
    queued items, `block=True` makes `submit` wait for room (the work must not be lost: the caller
    slows down instead); `block=False` drops the oldest (the work is best-effort)."""

    def __init__(self, name: str, run: Callable[[list[T]], None], max_pending: int, block: bool):
        self.name, self._run_batch, self.max_pending, self.block = name, run, max_pending, block
        self._pending: deque[T] = deque()
        self._cond = threading.Condition()
        self._busy = self._closed = False
        self._thread: threading.Thread | None = None
        self.busy_s = 0.0  # time spent running batches, in all (what the work costs, off the caller's thread)
        self.dropped = 0

    def submit(self, items: list[T]) -> None:
        if not items:
            return
        with self._cond:
            if self._closed:
                return
            if self.block:
                self._cond.wait_for(lambda: len(self._pending) < self.max_pending or self._closed)
            self._pending.extend(items)
            while len(self._pending) > self.max_pending:
                self._pending.popleft()
                self.dropped += 1
                log.warning("%s: behind by more than %d items; dropped the oldest", self.name, self.max_pending)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        """Until everything submitted so far has run; False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: (not self._pending and not self._busy) or self._closed, timeout_s)

    def close(self) -> None:
        """Drop what is queued; the batch running now finishes."""
        with self._cond:
            self._closed = True
            self._pending.clear()
            self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._closed)
                if self._closed:
                    return
                batch = list(self._pending)
                self._pending.clear()
                self._busy = True
                self._cond.notify_all()  # room again for a blocked submit
            started = time.perf_counter()
            try:
                self._run_batch(batch)
            except Exception:
                log.exception("%s failed on a batch of %d", self.name, len(batch))
            finally:
                with self._cond:
                    self.busy_s += time.perf_counter() - started
                    self._busy = False
                    self._cond.notify_all()
