"""Whether supervisors can be placed at all: with TRAINYARD_SUPERVISOR_RESOURCE set, each supervisor
asks Ray for a sliver of that resource (service/supervisor/actor.py), and Ray waits forever when
no node offers it. Said instead: in /readyz, and as an event of each job admitted meanwhile."""

from __future__ import annotations

MIB = 2**20


def placement_problem(resource: str, memory_mb: int, nodes: list[dict]) -> str | None:
    """Why no supervisor can be placed on these nodes (`ray.nodes()`), or None when one can."""
    if not resource:
        return None  # placed anywhere Ray likes
    offering = [n for n in nodes if n.get("Alive") and n.get("Resources", {}).get(resource, 0) > 0]
    if not offering:
        return (f"no Ray node offers the resource {resource!r} that TRAINYARD_SUPERVISOR_RESOURCE names, so no "
                f"supervisor can be placed: start a node with --resources='{{\"{resource}\": N}}' or change "
                "the setting")
    roomy = [n for n in offering if n["Resources"].get("memory", 0) >= memory_mb * MIB]
    if not roomy:
        return (f"no Ray node offering {resource!r} (TRAINYARD_SUPERVISOR_RESOURCE) has the "
                f"TRAINYARD_SUPERVISOR_MEMORY_MB={memory_mb} MiB of Ray memory a supervisor reserves")
    return None
