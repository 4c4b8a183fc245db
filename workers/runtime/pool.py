"""A pool of warm TrainWorker processes (torch and the trainer already imported).

Cold-starting a Ray actor that imports torch costs seconds per rank; a job that
takes warm workers starts training in about one. The pool holds no resources:
its actors use 0 CPUs while idle, and a job still reserves its CPUs with its own
placement group; each pooled worker is matched to a bundle on its own node and
exits by itself once that placement group is removed. GPU jobs always get fresh
actors, since Ray assigns devices at actor creation.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

import ray

from workers.program.prestarted import ENABLED as PRESTART
from workers.runtime.actor import TrainWorker

POOL_NAME = "trainyard-worker-pool"


@ray.remote(num_cpus=0, max_restarts=-1, max_concurrency=4)
class WarmPool:
    def __init__(self, size: int, refill_delay_s: float = 3.0, busy_fraction: float = 0.5):
        self.size, self.refill_delay_s, self.busy_fraction = size, refill_delay_s, busy_fraction
        self.starting: dict = {}  # ready ref -> name
        self.idle: list[tuple[str, str]] = []  # (name, node id)
        self.last_take = 0.0
        self._lock = threading.Lock()
        self._fill()
        threading.Thread(target=self._maintain, daemon=True).start()

    def _maintain(self) -> None:
        # Refill only when it cannot slow a job down: not right after a take (the job is
        # starting), all at once when no job holds CPUs, and beside a running job only while the
        # node's CPUs are idle and one worker at a time: each imports torch twice (the actor and its
        # pre-started Python), a few CPU-seconds that a job's ranks would otherwise wait behind.
        while True:
            time.sleep(1.0)
            with self._lock:
                if time.monotonic() - self.last_take < self.refill_delay_s:
                    continue
                if no_cpus_reserved():
                    self._harvest()
                    self._fill()
                elif cpus_idle(self.busy_fraction):
                    self._harvest()
                    if not self.starting:
                        self._fill(at_most=1)

    def _fill(self, at_most: int | None = None) -> None:
        missing = self.size - len(self.idle) - len(self.starting)
        for _ in range(missing if at_most is None else min(missing, at_most)):
            name = f"trainyard-warm-{uuid.uuid4().hex[:12]}"
            # @ray.remote adds .options (mypy ignores class decorators)
            actor = TrainWorker.options(name=name, lifetime="detached", num_cpus=0).remote(  # type: ignore[attr-defined]
                prestart=PRESTART)  # ready for a command program too (workers/program/prestarted.py)
            self.starting[actor.node_id.remote()] = name

    def _harvest(self) -> None:
        ready, _ = ray.wait(list(self.starting), num_returns=len(self.starting), timeout=0)
        for ref in ready:
            name = self.starting.pop(ref)
            try:
                self.idle.append((name, ray.get(ref)))
            except ray.exceptions.RayError:
                pass  # died while starting; _fill replaces it

    def take(self, node_ids: list[str]) -> list[str | None]:
        """For each wanted node, the name of an idle warm worker there, or None. Refills later."""
        with self._lock:
            self._harvest()
            self.last_take = time.monotonic()
            names: list[str | None] = []
            for node in node_ids:
                match = next((w for w in self.idle if w[1] == node), None)
                if match:
                    self.idle.remove(match)
                names.append(match[0] if match else None)
            return names

    def stats(self) -> dict:
        with self._lock:
            self._harvest()
            return {"size": self.size, "idle": len(self.idle), "starting": len(self.starting)}

    def shutdown(self) -> None:
        with self._lock:
            self._kill_all()

    def _kill_all(self) -> None:
        for name in [n for n, _ in self.idle] + list(self.starting.values()):
            try:
                ray.kill(ray.get_actor(name))
            except ValueError:
                pass
        self.idle, self.starting, self.size = [], {}, 0


def no_cpus_reserved() -> bool:
    """No job holds CPUs anywhere on the cluster (the pool's workers and standby supervisors
    reserve none). The load average alone lags a finished job by a minute, and on a small
    machine Ray's own processes may keep it up."""
    return ray.available_resources().get("CPU", 0) >= ray.cluster_resources().get("CPU", 0)


def cpus_idle(busy_fraction: float = 0.5) -> bool:
    """True while the 1-minute load average is below this fraction of the node's cores."""
    return os.getloadavg()[0] < busy_fraction * (os.cpu_count() or 1)


def start_pool(size: int, refill_delay_s: float = 3.0, busy_fraction: float = 0.5):
    """Get or create the cluster's warm pool (named, detached)."""
    # @ray.remote adds .options (mypy ignores class decorators)
    return WarmPool.options(name=POOL_NAME, lifetime="detached", get_if_exists=True).remote(  # type: ignore[attr-defined]
        size, refill_delay_s, busy_fraction)


TAKE_TIMEOUT_S = 30.0


def take_warm(node_ids: list[str], timeout_s: float = TAKE_TIMEOUT_S) -> list[str | None]:
    """For each node, an idle warm worker's name there, or None (start a fresh one).

    The pool only saves start-up time, so a pool that cannot answer gives no warm workers rather
    than failing the group: after its node was lost the detached pool is restarting elsewhere or
    unreachable for a while, and every group formed meanwhile failed with ActorUnavailableError,
    using up its job's restarts within a minute (found by the soak: 6 jobs FAILED after a node loss).
    """
    pool = find_pool()
    if pool is None:
        return [None] * len(node_ids)
    try:
        return ray.get(pool.take.remote(node_ids), timeout=timeout_s)
    except ray.exceptions.RayError:  # restarting, unreachable (RayActorError, ActorUnavailableError) or slow
        return [None] * len(node_ids)


def find_pool():
    try:
        return ray.get_actor(POOL_NAME)
    except ValueError:
        return None
