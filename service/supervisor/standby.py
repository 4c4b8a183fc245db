"""Standby supervisors: idle JobSupervisor actors, already started, the supervisor's code imported.

Admitting a job then costs one method call instead of starting a new Python process
for a new Ray actor. The pool is named per control
plane (`trainyard-standby-<plane id>-...`), so a restarted control plane can
clear away its predecessor's unused standbys without touching anyone else's.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import uuid
from typing import Any

from service.cluster_port import Cluster, ReplyKind

log = logging.getLogger("trainyard.standby")
STANDBY_PREFIX = "trainyard-standby-"


def plane_id(database_url: str) -> str:
    """Stable across restarts of the same control plane (same database), distinct between planes."""
    return hashlib.sha256(database_url.encode()).hexdigest()[:10]


class StandbyPool:
    """Thread-safe: the scheduler takes standbys for its admissions without the launch lock, while the
    reconciler refills the pool and the orphan sweep reads its names."""

    def __init__(self, plane: str, size: int, cluster: Cluster):
        self.prefix, self.size, self.cluster = f"{STANDBY_PREFIX}{plane}-", size, cluster
        self.ready: list[tuple[str, Any]] = []
        self.starting: dict = {}  # ready() ref -> (name, handle)
        # Taken for a job whose admission is not committed yet: still this pool's to the orphan sweep,
        # which reads these names before the jobs' (service/sweeps.py), until `settle` or `give_back`.
        self.lent: set[str] = set()
        self._lock = threading.RLock()

    def refill(self) -> None:
        with self._lock:
            self._harvest()
            while len(self.ready) + len(self.starting) < self.size:
                name = f"{self.prefix}{uuid.uuid4().hex[:12]}"
                handle = self.cluster.create_supervisor(name)
                self.starting[handle.ready.remote()] = (name, handle)

    def _harvest(self) -> None:
        if not self.starting:
            return
        for ref, reply in self.cluster.gather(dict(zip(self.starting, self.starting)), 0.0).items():
            if reply.kind == ReplyKind.NO_ANSWER:
                continue  # still starting
            name, handle = self.starting.pop(ref)
            if reply.kind == ReplyKind.ANSWERED:
                self.ready.append((name, handle))
            else:
                log.warning("standby supervisor %s did not start: %s", name, reply.error)

    def take(self) -> tuple[str, Any] | None:
        """A ready standby (name, handle); else one still starting (the job's call waits for its
        start-up, which is already under way: sooner than a new actor's); else None."""
        with self._lock:
            self._harvest()
            taken = self.ready.pop(0) if self.ready else (
                self.starting.pop(next(iter(self.starting))) if self.starting else None)
            if taken is not None:
                self.lent.add(taken[0])
            return taken

    def give_back(self, standby: tuple[str, Any]) -> None:
        with self._lock:
            self.lent.discard(standby[0])
            self.ready.insert(0, standby)

    def settle(self, name: str) -> None:
        """The job that took this standby is committed: its row names it from now on."""
        with self._lock:
            self.lent.discard(name)

    def names(self) -> set[str]:
        with self._lock:
            return {name for name, _ in self.ready} | {name for name, _ in self.starting.values()} | self.lent

    def owns(self, name: str) -> bool:
        return name.startswith(self.prefix)

    def shutdown(self) -> None:
        with self._lock:
            standbys, self.ready, self.starting = [*self.ready, *self.starting.values()], [], {}
        for _, handle in standbys:
            self.cluster.kill(handle)
