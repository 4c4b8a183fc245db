"""The shard actors' names, and finding and killing them by name: torch-free, for the supervisor's side
(workers/runtime/group.py kills an attempt's shards and tells them of a lost trainer)."""

from __future__ import annotations

from typing import Any

__all__ = ["kill_named", "named_shards", "shard_prefix", "tell_lost"]


def shard_prefix(placement_group_id: str) -> str:
    """The name every shard actor of a job's attempt starts with: its placement group's id (the ranks' and
    the supervisor's shared knowledge)."""
    return f"trainyard-ps-{placement_group_id}"


def named_shards(prefix: str) -> list[Any]:
    """The live shard actors whose names start with `prefix`, in shard order."""
    import ray

    names = sorted((n for n in ray.util.list_named_actors() if n.startswith(f"{prefix}-shard-")),
                   key=lambda n: int(n.rsplit("-", 1)[1]))
    handles = []
    for n in names:
        try:
            handles.append(ray.get_actor(n))
        except ValueError:  # gone meanwhile
            pass
    return handles


def kill_named(prefix: str) -> int:
    """Kill the shard actors named `{prefix}-shard-*`; how many there were."""
    import ray

    handles = named_shards(prefix)
    for handle in handles:
        try:
            ray.kill(handle, no_restart=True)
        except Exception:  # already dead
            pass
    return len(handles)


def tell_lost(prefix: str, trainer: int, timeout_s: float = 10.0) -> bool:
    """Tell the shards named `{prefix}-shard-*` that trainer `trainer` is lost for good; whether they heard."""
    import ray

    handles = named_shards(prefix)
    try:
        ray.get([h.leave.remote(trainer) for h in handles], timeout=timeout_s)
    except (ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
        return False
    return bool(handles)
