"""The scheduler's in-memory queue: one sorted list per tenant, changed one job at a time.

The scheduler reads only what changed since its last tick (jobs that entered or left QUEUED) and
applies it here, so a tick never reloads the queue from the database; a full reload
(`replace_all`) is the rare safety net. A tenant's list stays in its admission order (priority,
then age), so planning walks it without sorting.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Mapping

from service.queueing.rows import QueueBounds, QueuedJob


def _order(job: QueuedJob) -> tuple[int, float, str]:
    return job.order


class QueueIndex:
    def __init__(self, jobs: Iterable[QueuedJob] = ()):
        self._jobs: dict[str, QueuedJob] = {}
        self._queues: dict[str, list[QueuedJob]] = {}
        self._bounds: dict[str, QueueBounds] = {}  # per tenant, computed when asked, forgotten on a change
        self.replace_all(jobs)

    def __len__(self) -> int:
        return len(self._jobs)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def get(self, job_id: str | None) -> QueuedJob | None:
        return self._jobs.get(job_id) if job_id is not None else None

    def queues(self) -> Mapping[str, list[QueuedJob]]:
        """Tenant id -> its queued jobs in admission order (only tenants with some). Read-only."""
        return self._queues

    def bounds(self, tenant_id: str) -> QueueBounds:
        """The tenant's QueueBounds: one pass over its queue, then kept until its queue changes."""
        if tenant_id not in self._bounds:
            queue = self._queues[tenant_id]
            self._bounds[tenant_id] = QueueBounds(min(j.queued_at for j in queue), min(j.cpus for j in queue),
                                                  min(j.gpus for j in queue))
        return self._bounds[tenant_id]

    def replace_all(self, jobs: Iterable[QueuedJob]) -> None:
        self._jobs = {job.id: job for job in jobs}
        self._queues, self._bounds = {}, {}
        for job in self._jobs.values():
            self._queues.setdefault(job.tenant_id, []).append(job)
        for queue in self._queues.values():
            queue.sort(key=_order)

    def upsert(self, job: QueuedJob) -> bool:
        """Add the job, or replace what the index had for it; False if it had exactly this already."""
        known = self._jobs.get(job.id)
        if known == job:
            return False
        if known is not None:
            self.remove(job.id)
        self._jobs[job.id] = job
        self._bounds.pop(job.tenant_id, None)
        insort(self._queues.setdefault(job.tenant_id, []), job, key=_order)
        return True

    def remove(self, job_id: str) -> bool:
        """Forget the job (it left QUEUED); False if the index did not have it."""
        job = self._jobs.pop(job_id, None)
        if job is None:
            return False
        self._bounds.pop(job.tenant_id, None)
        queue = self._queues[job.tenant_id]
        del queue[bisect_left(queue, job.order, key=_order)]
        if not queue:
            del self._queues[job.tenant_id]
        return True
