"""Standby supervisors: idle JobSupervisor actors, already started, torch and the runtime imported.

Admitting a job then costs one method call instead of a new Python process
importing torch (seconds on a small machine). The pool is named per control
plane (`trainyard-standby-<plane id>-...`), so a restarted control plane can
clear away its predecessor's unused standbys without touching anyone else's.
"""

from __future__ import annotations

import hashlib
import logging
import uuid

import ray
from ray.actor import ActorHandle

from service.ray_client import NAMESPACE
from service.supervisor.actor import create_supervisor

log = logging.getLogger("trainyard.standby")
STANDBY_PREFIX = "trainyard-standby-"


def plane_id(database_url: str) -> str:
    """Stable across restarts of the same control plane (same database), distinct between planes."""
    return hashlib.sha256(database_url.encode()).hexdigest()[:10]


class StandbyPool:
    def __init__(self, plane: str, size: int):
        self.prefix, self.size = f"{STANDBY_PREFIX}{plane}-", size
        self.ready: list[tuple[str, ActorHandle]] = []
        self.starting: dict = {}  # ready() ref -> (name, handle)

    def refill(self) -> None:
        self._harvest()
        while len(self.ready) + len(self.starting) < self.size:
            name = f"{self.prefix}{uuid.uuid4().hex[:12]}"
            handle = create_supervisor(name)
            self.starting[handle.ready.remote()] = (name, handle)

    def _harvest(self) -> None:
        if not self.starting:
            return
        done, _ = ray.wait(list(self.starting), num_returns=len(self.starting), timeout=0)
        for ref in done:
            name, handle = self.starting.pop(ref)
            try:
                ray.get(ref)
                self.ready.append((name, handle))
            except ray.exceptions.RayError as exc:
                log.warning("standby supervisor %s did not start: %s", name, exc)

    def take(self) -> tuple[str, ActorHandle] | None:
        """A ready standby (name, handle); else one still starting (the job's call waits for its
        start-up, which is already under way: sooner than a new actor's); else None."""
        self._harvest()
        if self.ready:
            return self.ready.pop(0)
        if self.starting:
            return self.starting.pop(next(iter(self.starting)))
        return None

    def give_back(self, standby: tuple[str, ActorHandle]) -> None:
        self.ready.insert(0, standby)

    def names(self) -> set[str]:
        return {name for name, _ in self.ready} | {name for name, _ in self.starting.values()}

    def owns(self, name: str) -> bool:
        return name.startswith(self.prefix)

    def shutdown(self) -> None:
        for _, handle in [*self.ready, *self.starting.values()]:
            try:
                ray.kill(handle, no_restart=True)
            except Exception:
                pass
        self.ready, self.starting = [], {}


def named_actors() -> list[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a.get("namespace") == NAMESPACE]
