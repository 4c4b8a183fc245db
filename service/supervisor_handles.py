"""The supervisors' handles the leader's two loops share (service/leader_loops.py)."""

from __future__ import annotations

import threading
from typing import Any


class Handles(dict):
    """Job id -> supervisor actor handle, shared by the scheduler's and the reconciler's threads.
    Each operation is atomic; `take_if` removes a job's handle only if it is still the one given,
    so a supervisor the scheduler started for a re-admitted job is never taken for its old one."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()

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

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return dict(self)

    def take_if(self, job_id: str, handle: Any) -> bool:
        with self._lock:
            if super().get(job_id) is handle:
                super().__delitem__(job_id)
                return True
            return False
