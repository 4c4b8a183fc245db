"""The scheduler's queue index (service/queueing/index.py), kept current by what changed, not reloaded per tick.

Each tick reads the jobs that entered QUEUED since the last read (`queued_at`: a submit on any
replica, or a requeue after preemption) and the jobs that ended since (`finished_at`: cancelled,
failed), both through an index, and only the columns the scheduler orders and fits by. The window
starts `overlap_s` before the last read: the stamps come from the clocks of the replicas that wrote
them, and a row committed a moment after its stamp must still be seen; reading a known row again
changes nothing. The scheduler drops the jobs it admits itself. Every `resync_s` a full read of
the queue (the same few columns) is the safety net for anything a window missed (a clock far off,
a transaction open longer than the overlap); it runs on a thread of its own and its index is
swapped in at a later tick, so no tick waits for 10,000 rows.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from sqlalchemy.orm import Session

from service.db import repository as repo
from service.queueing import QueuedJob, QueueIndex

log = logging.getLogger("trainyard.scheduler")
CLOCK_OVERLAP_S = 5.0  # replicas' clock skew plus a submit's stamp-to-commit time, with room to spare
RESYNC_S = 60.0


def queued_job(row) -> QueuedJob:
    """A repo.queue_rows row as the policy reads it."""
    created = _seconds(row.created_at)
    queued = _seconds(row.queued_at) if row.queued_at is not None else created
    return QueuedJob(row.id, row.tenant_id, row.priority, created, queued, row.world_size, row.cpus, row.gpus)


def _seconds(ts: datetime) -> float:
    aware = repo.aware(ts)
    assert aware is not None
    return aware.timestamp()


class QueueFeed:
    def __init__(self, resync_s: float = RESYNC_S, overlap_s: float = CLOCK_OVERLAP_S,
                 clock: Callable[[], float] = time.time, sessions: Callable[[], Any] | None = None):
        """`sessions`: where the periodic full read opens its own session, on a thread of its own, so a
        tick never waits for it (10,000 queued jobs: 0.1 s on a quiet host, most of a loaded one's
        tick); None reads it inline. The first read is always inline: there is no index before it."""
        self.index = QueueIndex()
        self.resync_s, self.overlap_s, self.clock, self.sessions = resync_s, overlap_s, clock, sessions
        self._read_at: float | None = None  # this process's clock when the last read began
        self._full_at: float | None = None
        self.full_reads = self.change_reads = 0
        self._resync: _Resync | None = None  # a full read in flight on its own thread

    def refresh(self, s: Session) -> None:
        """Bring the index up to date: a read of the changes, or the periodic full read."""
        now = self.clock()
        if self._resync is not None and self._resync.done.is_set():
            self._swap_in(self._resync)
        if self._full_at is None or self._read_at is None:
            self._read_all(s, now)
        elif now - self._full_at >= self.resync_s and self.sessions is None:
            self._read_all(s, now)
        else:
            if now - self._full_at >= self.resync_s and self._resync is None:
                self._resync = _Resync(self.sessions, now)  # type: ignore[arg-type]
            self._read_changes(s, self._read_at)
        self._read_at = now

    def _read_all(self, s: Session, now: float) -> None:
        self.index.replace_all(queued_job(r) for r in repo.queue_rows(s))
        self._full_at = now
        self.full_reads += 1

    def _read_changes(self, s: Session, after: float) -> None:
        since = datetime.fromtimestamp(after - self.overlap_s, timezone.utc)
        for row in repo.queue_rows(s, since):
            self.index.upsert(queued_job(row))
        for job_id in repo.ended_since(s, since):
            self.index.remove(job_id)
        self.change_reads += 1

    def _swap_in(self, resync: _Resync) -> None:
        """The background full read's index replaces ours: the jobs this scheduler took off the queue
        since the read began go from it, and the changes since then are read as usual (the caller's
        next read starts from the moment the full read began)."""
        self._resync = None
        if resync.index is None:  # the read failed: try again at the next interval
            self._full_at = self.clock()
            return
        for job_id in resync.dropped:
            resync.index.remove(job_id)
        self.index = resync.index
        self._full_at = self._read_at = resync.started
        self.full_reads += 1

    def drop(self, job_id: str) -> None:
        """The job left QUEUED (admitted, failed, or found gone when claimed)."""
        self.index.remove(job_id)
        if self._resync is not None:
            self._resync.dropped.add(job_id)

    def resync_next(self) -> None:
        """Read the whole queue on the next refresh (something may have been missed)."""
        self._full_at = None


class _Resync:
    """One full read of the queue on a thread of its own, into a fresh index."""

    def __init__(self, sessions: Callable[[], Any], started: float):
        self.started = started
        self.index: QueueIndex | None = None
        self.dropped: set[str] = set()  # taken off the queue by the scheduler while the read ran
        self.done = threading.Event()
        threading.Thread(target=self._run, args=(sessions,), name="trainyard-queue-resync", daemon=True).start()

    def _run(self, sessions) -> None:
        try:
            index = QueueIndex()
            with sessions() as s:
                index.replace_all(queued_job(r) for r in repo.queue_rows(s))
            self.index = index
        except Exception:
            log.exception("reading the whole queue failed; the index goes on from the changes")
        finally:
            self.done.set()
