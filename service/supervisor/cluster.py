"""What the run loop needs of a worker group and of the cluster: two small Protocols.

`WorkerGroup` (workers/runtime/group.py) and `RayCluster` below are the real ones; a test drives
the loop with fakes of these interfaces (tests/service/test_supervisor_step.py), no Ray.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

from workers.events import RankEvent
from workers.runtime.group_owner import GroupOwner
from workers.spec import JobSpec
from workers.storage import Storage
from workers.training.control import UnevenShares


class Group(Protocol):
    nodes: list[str]  # the node of each rank, once placed
    results: list[dict | None]
    warm_workers: int
    master: tuple[str, int] | None

    def start(self, timeout_s: float, uneven: UnevenShares | None = None) -> list[dict]: ...
    def poll(self, timeout_s: float = 30.0) -> list[RankEvent]: ...  # each rank's events since the last
    def check(self) -> bool: ...  # True once every rank finished; raises GroupFailure if one failed
    def request_stop(self) -> None: ...
    def request_shares(self, version: int, shares: list[int]) -> None: ...
    def bundle(self) -> dict[str, float]: ...
    def shutdown(self) -> None: ...


# (spec, the job's storage, attempt, the supervisor that owns it, nodes to avoid, "is the job being cancelled?")
# -> a group, not started yet
GroupFactory = Callable[[JobSpec, Storage, int, GroupOwner, frozenset[str], Callable[[], bool]], Group]


class Cluster(Protocol):
    def free_slots_per_node(self, bundle: dict[str, float]) -> dict[str, int]: ...


class RayCluster:
    def free_slots_per_node(self, bundle: dict[str, float]) -> dict[str, int]:
        """How many more workers of this shape fit on each live node right now (by node id)."""
        import ray

        per_node = ray._private.state.available_resources_per_node()
        return {node: min(math.floor(available.get(key, 0.0) / need + 1e-9) for key, need in bundle.items()
                          if need > 0)
                for node, available in per_node.items()}


def free_worker_slots(cluster: Cluster, bundle: dict[str, float], exclude: frozenset[str] = frozenset()) -> int:
    """How many more workers of this shape fit on the live nodes right now, leaving out `exclude`."""
    return sum(n for node, n in cluster.free_slots_per_node(bundle).items() if node not in exclude)
