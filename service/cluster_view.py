"""The cluster's size by which admission and the scheduler judge that a job "can never run": the
nodes alive now, plus those lost within `node_return_grace_s` that no node has replaced: one that
came up at the same address after the lost one was last seen (several raylets of one host share it).
A node restarting (a pod rescheduled, a host rebooting) is still part of the cluster: a job that
needs it waits in the queue, and fails only once the node has stayed away past the grace.

Ray lists a dead node without its resources, so the view remembers what each node had when alive.
Besides CPU and GPU, a node's `memory` (bytes Ray lets its tasks use) when the nodes report it: admission
compares a job's predicted peak per worker with the largest node's (service/admission/submit.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

Capacity = tuple[dict[str, float], dict[str, float]]  # (total, the largest node's), CPU, GPU (and memory)
KEYS = ("CPU", "GPU")
MEMORY = "memory"  # bytes; present in the capacity only when some node reports it


@dataclass(frozen=True)
class SeenNode:
    address: str
    resources: dict[str, float]
    since: float  # monotonic time it was first seen alive
    alive_at: float  # and last


class ClusterView:
    def __init__(self, grace_s: float, clock: Callable[[], float] = time.monotonic):
        self.grace_s, self.clock = grace_s, clock
        self._seen: dict[str, SeenNode] = {}

    def observe(self, nodes: list[dict]) -> Capacity:
        """The capacity, given `ray.nodes()` now."""
        now = self.clock()
        alive = [n for n in nodes if n.get("Alive")]
        for n in alive:
            before = self._seen.get(n["NodeID"])
            kept = {k: float(n["Resources"].get(k, 0.0)) for k in KEYS}
            if MEMORY in n["Resources"]:
                kept[MEMORY] = float(n["Resources"][MEMORY])
            self._seen[n["NodeID"]] = SeenNode(n.get("NodeManagerAddress", ""), kept,
                                               before.since if before else now, now)
        live = {i: self._seen[i] for i in {n["NodeID"] for n in alive}}
        self._seen = {i: s for i, s in self._seen.items() if i in live or now - s.alive_at < self.grace_s}

        def replaced(lost: SeenNode) -> bool:
            return any(s.address == lost.address and s.since > lost.alive_at for s in live.values())

        counted = [s for i, s in self._seen.items() if i in live or not replaced(s)]
        keys = KEYS + ((MEMORY,) if any(MEMORY in s.resources for s in counted) else ())
        total = {k: sum(s.resources.get(k, 0.0) for s in counted) for k in keys}
        largest = {k: max((s.resources.get(k, 0.0) for s in counted), default=0.0) for k in keys}
        return total, largest
