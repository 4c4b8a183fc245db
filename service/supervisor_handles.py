"""The supervisors' handles the leader's two loops share (service/leader_loops.py)."""

from __future__ import annotations

import threading
from typing import Any


class Handles(dict):
    """Job id -> supervisor actor handle, shared by the scheduler's and the reconciler's threads.
    Each operation is atomic; `take_if` removes a job's handle only if it is still the one given,
    so a supervisor the scheduler started for a re-admitted job is never taken for its old one.

    A job the scheduler has committed STARTING but whose supervisor it is still starting (outside the
    launch lock: service/scheduler_launches.py) is marked `launching`: the reconciler leaves it alone
    until its handle is in (or its start failed, which the reconciler then retries)."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._launching: set[str] = set()

    def launching(self, job_id: str) -> None:
        with self._lock:
            self._launching.add(job_id)

    def launched(self, job_id: str, handle: Any | None) -> None:
        """The start is over: its handle in (None: it failed, the reconciler's to retry), the mark gone."""
        with self._lock:
            if handle is not None:
                super().__setitem__(job_id, handle)
            self._launching.discard(job_id)

    def is_launching(self, job_id: str) -> bool:
        with self._lock:
            return job_id in self._launching

    def __setitem__(self, job_id: str, handle: Any) -> None:
        with self._lock:
            super().__setitem__(job_id, handle)

    def __delitem__(self, job_id: str) -> None:
        with self._lock:
            super().__delitem__(job_id)

    def pop(self, job_id, *default):  # type: ignore[override]
        with self._lock:
            return super().pop(job_id, *default)

    def clear(self) -> None:
        with self._lock:
            super().clear()
            self._launching.clear()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return dict(self)

    def take_if(self, job_id: str, handle: Any) -> bool:
        with self._lock:
            if super().get(job_id) is handle:
                super().__delitem__(job_id)
                return True
            return False
