"""Checkpoint sizes, listed on the store after the reconciler's commit, on a thread of their own.

The reconciler stores a checkpoint's event and row with its pass (no store call inside the
transaction); this worker then lists the checkpoint's files on the store, writes the byte count
into the event's data in a small transaction of its own (fenced like the pass's), and sets the
job's `trainyard_checkpoint_bytes` gauge. A store that is slow or down delays only this worker,
never a pass: a listing that fails leaves the size unknown (as before), and the queue is bounded.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from service.background import Background
from service.db import batched
from service.db.engine import SessionSource
from service.live_metrics import LiveMetrics
from service.metric_catalogue import update
from workers.storage import Storage

log = logging.getLogger("trainyard.checkpoint_sizes")
MAX_PENDING = 10_000  # checkpoints waiting to be listed; older ones beyond this keep no size


@dataclass(frozen=True)
class Sizing:
    job_id: str
    event_id: int  # the checkpoint event whose data gains "bytes"
    data: dict  # that event's data as stored
    where: Storage  # the checkpoint's directory on the store


def checkpoint_bytes(checkpoint: Storage) -> int | None:
    """Bytes of a checkpoint's files on its store (one listing); None if the store does not answer."""
    try:
        return sum(checkpoint.sizes().values()) or None
    except Exception as exc:  # a store outage costs the size, nothing else
        log.warning("listing checkpoint %s failed: %s: %s", checkpoint.uri, type(exc).__name__, exc)
        return None


class CheckpointSizer:
    def __init__(self, sessions: SessionSource, metrics: LiveMetrics):
        self.sessions, self.metrics = sessions, metrics
        self.worker: Background[Sizing] = Background("trainyard-checkpoint-sizes", self._size, MAX_PENDING,
                                                     block=False)

    def submit(self, items: list[Sizing]) -> None:
        self.worker.submit(items)

    def _size(self, batch: list[Sizing]) -> None:
        sized = [(item, n) for item in batch if (n := checkpoint_bytes(item.where)) is not None]
        if not sized:
            return
        with self.sessions.begin() as s:  # fenced: a replica that lost the lease writes nothing
            batched.set_event_data(s, {item.event_id: {**item.data, "bytes": n} for item, n in sized})
        self.metrics.apply([update("trainyard_checkpoint_bytes", "set", n, job=item.job_id) for item, n in sized])
