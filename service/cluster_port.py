"""What the control plane asks of the cluster, in one place: the port its loops talk through.

The scheduler, reconciler, supervisor launcher, standby pool and sweeps never call Ray directly:
they take a `Cluster`. The service runs on `RayCluster` (service/ray_cluster.py); the fleet
simulator (bench/fleet/) plugs in a simulated cluster of a thousand nodes behind the same port,
so everything above it, the database, the HTTP API and the loops, is the real service.

Supervisor handles keep Ray's calling convention (`handle.drain.remote(ack)` returns a reference);
`gather` waits for many references under one deadline and says, per reference, how it ended.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Hashable, Protocol, TypeVar

from workers.runtime.group_owner import GroupOwner

K = TypeVar("K", bound=Hashable)


class ReplyKind(str, Enum):
    ANSWERED = "answered"  # `value` holds the method's return value
    NO_ANSWER = "no_answer"  # not back by the deadline: ask again next pass
    UNAVAILABLE = "unavailable"  # alive but unreachable this moment (a loaded node, a blip)
    GONE = "gone"  # the actor died: its job needs a new supervisor
    FAILED = "failed"  # the method raised: the actor lives, the call is tried again next pass


@dataclass(frozen=True)
class Reply:
    kind: ReplyKind
    value: Any = None
    error: str = ""


class Cluster(Protocol):
    def connect(self) -> None:
        """Attach to (or start) the cluster; raises while it cannot be reached."""

    def release(self) -> None:
        """Let go of the cluster (a local one this process started stops)."""

    def nodes(self) -> list[dict]:
        """Every node as `ray.nodes()` lists it: NodeID, Alive, NodeManagerAddress, Resources."""

    def available_resources(self) -> dict[str, float]:
        """Resources free now, summed over the live nodes (CPU, GPU, ...)."""

    def available_per_node(self) -> dict[str, dict[str, float]]:
        """Resources free now on each live node, by NodeID (GET /v1/cluster)."""

    def created_group_owners(self) -> set[GroupOwner]:
        """Owners of the placement groups that are created (hold their resources) now."""

    def placement_groups(self) -> dict[str, dict]:
        """Placement group id -> Ray's table entry (name, state), for the leaked-group sweep."""

    def remove_placement_group(self, group_id: str) -> bool:
        """Remove a group by id; False if it was already gone."""

    def create_supervisor(self, name: str) -> Any:
        """An idle, detached supervisor actor with this name; its handle."""

    def find_supervisor(self, name: str | None) -> Any | None:
        """The live supervisor with this name, or None."""

    def named_actors(self) -> list[str]:
        """Names of the service's named actors (supervisors and standbys)."""

    def kill(self, handle: Any) -> None:
        """Stop an actor for good; no error if it is already gone."""

    def gather(self, refs: dict[K, Any], timeout_s: float) -> dict[K, Reply]:
        """Wait for all `refs` at once, at most `timeout_s` in all; how each ended."""
