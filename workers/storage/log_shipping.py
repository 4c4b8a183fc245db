"""Ships a growing local log file to an object store as chunks (layout: workers/storage/log_chunks.py).

A rank or a supervisor writes its log to a file on its own node's disk, which nobody else sees; a
thread here copies what is new to the store every `interval_s`, and `close` ships the rest. The open
chunk is rewritten with its longer self until it is sealed, by size (`chunk_bytes`) or by age
(`seal_s`): a slow log then costs at most seal_s / interval_s rewrites of a small chunk, a fast one
about one upload per byte, and the number of objects stays near one per `seal_s` or per `chunk_bytes`.
A store that fails a write is retried at the next tick (the bytes wait in the local file); a log
is never the reason a job fails.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from workers.os_thread_name import name_os_thread
from workers.storage.location import Storage
from workers.storage.log_chunks import chunk_name, log_size

log = logging.getLogger("trainyard.log_shipping")


@dataclass(frozen=True)
class ShippingPolicy:
    interval_s: float = 1.0  # a follower sees a line about this late
    chunk_bytes: int = 1 << 20  # a chunk is sealed at this size ...
    seal_s: float = 30.0  # ... or this long after it was opened


class LogShipper:
    """`local` (growing) -> `storage/<log>/<offset>`; `start` the thread, `close` to ship the rest."""

    def __init__(self, local: Path, storage: Storage, log_name: str, policy: ShippingPolicy = ShippingPolicy()):
        self.local, self.storage, self.log_name, self.policy = Path(local), storage, log_name, policy
        self.base: int | None = None  # what earlier processes of this rank shipped (read at the first ship)
        self.open_at = 0  # where the open chunk starts in the local file
        self.open_len = 0  # bytes of the open chunk already on the store
        self.opened = time.monotonic()
        self._lock = threading.Lock()  # one ship at a time: the thread's and close()'s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.shipped_bytes = 0  # uploaded, rewrites included (what the store was sent)

    def start(self) -> LogShipper:
        self._thread = threading.Thread(target=self._loop, name=f"ship-{self.log_name}", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self.ship()

    def _loop(self) -> None:
        name_os_thread("ship-logs")
        while not self._stop.wait(self.policy.interval_s):
            try:
                self.ship()
            except Exception as exc:  # the store is down: the bytes stay in the local file for the next tick
                log.warning("shipping %s to %s failed (retried): %s", self.log_name, self.storage.uri, exc)

    def ship(self) -> None:
        """Upload what the local file has beyond what is on the store, sealing full or old chunks."""
        with self._lock:
            try:
                size = self.local.stat().st_size
            except FileNotFoundError:
                return
            if self.base is None and size > 0:  # continue after an earlier process's log (a restarted rank)
                self.base = log_size(self.storage, self.log_name)
            while size > self.open_at + self.open_len:
                assert self.base is not None
                if self.open_len and time.monotonic() - self.opened >= self.policy.seal_s:
                    self._seal()  # old: the new bytes start a chunk, this one stays as it is
                with self.local.open("rb") as f:
                    f.seek(self.open_at)
                    data = f.read(self.policy.chunk_bytes)
                self.storage.write_bytes(chunk_name(self.log_name, self.base + self.open_at), data)
                self.shipped_bytes += len(data)
                self.open_len = len(data)
                if self.open_len >= self.policy.chunk_bytes:
                    self._seal()

    def _seal(self) -> None:
        self.open_at, self.open_len, self.opened = self.open_at + self.open_len, 0, time.monotonic()
