"""The scheduler's queue index (service/queueing/index.py), kept current by what changed, not reloaded per tick.

Each tick reads the jobs that entered QUEUED since the last read (`queued_at`: a submit on any
replica, or a requeue after preemption) and the jobs that ended since (`finished_at`: cancelled,
failed), both through an index, and only the columns the scheduler orders and fits by. The window
starts `overlap_s` before the last read: the stamps come from the clocks of the replicas that wrote
them, and a row committed a moment after its stamp must still be seen; reading a known row again
changes nothing. The scheduler drops the jobs it admits itself. Every `resync_s` a full read of
the queue (the same few columns) is the safety net for anything a window missed (a clock far off,
a transaction open longer than the overlap).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timezone

from sqlalchemy.orm import Session

from service.db import repository as repo
from service.queueing import QueuedJob, QueueIndex

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
                 clock: Callable[[], float] = time.time):
        self.index = QueueIndex()
        self.resync_s, self.overlap_s, self.clock = resync_s, overlap_s, clock
        self._read_at: float | None = None  # this process's clock when the last read began
        self._full_at: float | None = None
        self.full_reads = self.change_reads = 0

    def refresh(self, s: Session) -> None:
        """Bring the index up to date: a read of the changes, or the periodic full read."""
        now = self.clock()
        if self._full_at is None or self._read_at is None or now - self._full_at >= self.resync_s:
            self.index.replace_all(queued_job(r) for r in repo.queue_rows(s))
            self._full_at = now
            self.full_reads += 1
        else:
            since = datetime.fromtimestamp(self._read_at - self.overlap_s, timezone.utc)
            for row in repo.queue_rows(s, since):
                self.index.upsert(queued_job(row))
            for job_id in repo.ended_since(s, since):
                self.index.remove(job_id)
            self.change_reads += 1
        self._read_at = now

    def drop(self, job_id: str) -> None:
        """The job left QUEUED (admitted, failed, or found gone when claimed)."""
        self.index.remove(job_id)

    def resync_next(self) -> None:
        """Read the whole queue on the next refresh (something may have been missed)."""
        self._full_at = None
