"""The cluster port (service/cluster_port.py) on a real Ray cluster."""

from __future__ import annotations

import time
from typing import Any

import ray

from service.cluster_port import K, Reply, ReplyKind
from service.ray_client import NAMESPACE
from service.settings import Settings
from workers.runtime.group_owner import GroupOwner


class RayCluster:
    def __init__(self, settings: Settings):
        self.settings = settings

    def connect(self) -> None:
        from service.ray_client import connect

        connect(self.settings)

    def release(self) -> None:
        if not self.settings.ray_address:
            from service.ray_client import stop_local_ray

            stop_local_ray()

    def nodes(self) -> list[dict]:
        return ray.nodes()

    def available_resources(self) -> dict[str, float]:
        return ray.available_resources()

    def available_per_node(self) -> dict[str, dict[str, float]]:
        from ray._private.state import available_resources_per_node

        return available_resources_per_node()

    def created_group_owners(self) -> set[GroupOwner]:
        return {owner for pg in ray.util.placement_group_table().values() if pg.get("state") == "CREATED"
                if (owner := GroupOwner.of_group(pg.get("name", ""))) is not None}

    def placement_groups(self) -> dict[str, dict]:
        return ray.util.placement_group_table()

    def remove_placement_group(self, group_id: str) -> bool:
        from ray._raylet import PlacementGroupID
        from ray.util.placement_group import PlacementGroup, remove_placement_group

        try:  # by id: a group's name is looked up in the caller's Ray namespace, the supervisors' may differ
            remove_placement_group(PlacementGroup(PlacementGroupID(bytes.fromhex(group_id))))
        except (ValueError, ray.exceptions.RayError):  # removed meanwhile (by Ray or its supervisor)
            return False
        return True

    def create_supervisor(self, name: str) -> Any:
        from service.supervisor.actor import create_supervisor

        return create_supervisor(name, self.settings.supervisor_resource, self.settings.supervisor_memory_mb)

    def find_supervisor(self, name: str | None) -> Any | None:
        from service.supervisor.actor import find_supervisor

        return find_supervisor(name)

    def named_actors(self) -> list[str]:
        return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a.get("namespace") == NAMESPACE]

    def kill(self, handle: Any) -> None:
        try:
            ray.kill(handle, no_restart=True)
        except Exception:  # already gone
            pass

    def gather(self, refs: dict[K, Any], timeout_s: float) -> dict[K, Reply]:
        """One deadline for all: the replies that came back by then, NO_ANSWER for the rest."""
        if not refs:
            return {}
        key_of = {ref: key for key, ref in refs.items()}
        deadline = time.monotonic() + timeout_s
        pending = list(key_of)
        replies: dict[K, Reply] = {}
        while pending:  # at least one look, even with no time left (a poll: timeout 0)
            left = max(0.0, deadline - time.monotonic())
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=left)
            for ref in done:
                replies[key_of[ref]] = _reply(ref)
            if time.monotonic() >= deadline:
                break
        for ref in pending:
            replies[key_of[ref]] = Reply(ReplyKind.NO_ANSWER, error=f"no answer within {timeout_s:g}s")
        return replies


def _reply(ref: Any) -> Reply:
    try:
        return Reply(ReplyKind.ANSWERED, ray.get(ref, timeout=0))
    except ray.exceptions.ActorUnavailableError as exc:
        # Alive but unreachable this moment: a RayActorError too, but recovering would start a second
        # supervisor beside a live one (found by the soak). Ask again next pass.
        return Reply(ReplyKind.UNAVAILABLE, error=str(exc))
    except ray.exceptions.RayActorError as exc:
        return Reply(ReplyKind.GONE, error=str(exc))
    except ray.exceptions.GetTimeoutError as exc:
        return Reply(ReplyKind.NO_ANSWER, error=str(exc))
    except ray.exceptions.RayError as exc:  # the method itself raised
        return Reply(ReplyKind.FAILED, error=f"{type(exc).__name__}: {exc}")
