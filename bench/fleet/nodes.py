"""The simulated cluster's nodes and placement groups, as Ray's GCS keeps them.

Groups are created one at a time by one creator at a fixed rate (Ray's GCS schedules placement
groups one at a time), oldest first; a group that does not fit stays pending and the creator tries
the next ones (Ray retries an unschedulable group later rather than stalling the others), and
bundles are packed onto the nodes with the most free GPUs first (Ray's PACK).
A lost node takes its bundles with it: the groups that had one are marked broken for their owner.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field

KEYS = ("CPU", "GPU", "memory")
LOOK_AHEAD = 32  # pending groups tried per creation: one that does not fit does not stall the rest


@dataclass
class Node:
    node_id: str
    address: str
    total: dict[str, float]
    free: dict[str, float]
    alive: bool = True


@dataclass
class Group:
    group_id: str
    name: str
    bundles: list[dict[str, float]]
    state: str = "PENDING"  # PENDING -> CREATED -> REMOVED
    nodes: list[str] = field(default_factory=list)  # the node of each bundle, once created
    broken: bool = False  # a node it had a bundle on was lost
    created: threading.Event = field(default_factory=threading.Event)


class Fleet:
    """Nodes and groups behind one lock; `create_next` is driven by the creator thread."""

    def __init__(self, nodes: int, cpus: float, gpus: float, memory_bytes: float, groups_per_s: float,
                 bundles_per_s: float):
        self.lock = threading.Lock()
        self.nodes = {f"{i:056x}": Node(f"{i:056x}", f"10.{i // 65536}.{i // 256 % 256}.{i % 256}",
                                        {"CPU": cpus, "GPU": gpus, "memory": memory_bytes},
                                        {"CPU": cpus, "GPU": gpus, "memory": memory_bytes})
                      for i in range(1, nodes + 1)}
        self.groups: dict[str, Group] = {}
        self.pending: deque[str] = deque()
        self.groups_per_s, self.bundles_per_s = groups_per_s, bundles_per_s
        self.free_total = {k: sum(n.free[k] for n in self.nodes.values()) for k in KEYS}
        self.lost_nodes = 0

    # --- what Ray answers -------------------------------------------------------------

    def ray_nodes(self) -> list[dict]:
        with self.lock:
            return [{"NodeID": n.node_id, "Alive": n.alive, "NodeManagerAddress": n.address,
                     "Resources": dict(n.total) if n.alive else {}} for n in self.nodes.values()]

    def available(self) -> dict[str, float]:
        with self.lock:
            return dict(self.free_total)

    def available_per_node(self) -> dict[str, dict[str, float]]:
        with self.lock:
            return {n.node_id: dict(n.free) for n in self.nodes.values() if n.alive}

    def table(self) -> dict[str, dict]:
        with self.lock:
            return {g.group_id: {"name": g.name, "state": g.state} for g in self.groups.values()
                    if g.state != "REMOVED"}

    def free_slots_per_node(self, bundle: dict[str, float]) -> dict[str, int]:
        with self.lock:
            return {n.node_id: int(min(n.free.get(k, 0.0) // need for k, need in bundle.items() if need > 0))
                    for n in self.nodes.values() if n.alive}

    # --- groups -------------------------------------------------------------------------

    def request(self, name: str, bundles: list[dict[str, float]]) -> Group:
        group = Group(uuid.uuid4().hex[:36], name, bundles)
        with self.lock:
            self.groups[group.group_id] = group
            self.pending.append(group.group_id)
        return group

    def remove(self, group_id: str) -> bool:
        with self.lock:
            group = self.groups.pop(group_id, None)
            if group is None:
                return False
            if group.state == "CREATED":
                for node_id, bundle in zip(group.nodes, group.bundles):
                    node = self.nodes[node_id]
                    if node.alive:  # a lost node's resources are gone, not given back
                        for k, v in bundle.items():
                            node.free[k] += v
                            self.free_total[k] += v
            group.state = "REMOVED"
            group.created.set()  # wake a creator's waiter: the group is gone
            return True

    def create_next(self) -> float:
        """Create the oldest pending group that fits (of the first LOOK_AHEAD); the seconds it took."""
        with self.lock:
            self.pending = deque(g for g in self.pending if g in self.groups)  # removed while pending
            for group_id in list(self.pending)[:LOOK_AHEAD]:
                group = self.groups[group_id]
                placed = self._pack(group.bundles)
                if placed is not None:
                    self.pending.remove(group_id)
                    group.nodes, group.state = placed, "CREATED"
                    group.created.set()
                    return 1.0 / self.groups_per_s + len(group.bundles) / self.bundles_per_s
        return 0.0

    def _pack(self, bundles: list[dict[str, float]]) -> list[str] | None:
        need = {k: sum(b.get(k, 0.0) for b in bundles) for k in KEYS}
        if any(need[k] > self.free_total[k] + 1e-9 for k in KEYS):
            return None
        order = sorted((n for n in self.nodes.values() if n.alive), key=lambda n: -n.free["GPU"])
        taken: list[tuple[Node, dict[str, float]]] = []
        placed: list[str] = []
        nodes = iter(order)
        node = next(nodes, None)
        for bundle in bundles:
            while node is not None and any(node.free.get(k, 0.0) < v - 1e-9 for k, v in bundle.items()):
                node = next(nodes, None)
            if node is None:
                for n, b in taken:  # roll back: it does not fit after all (fragmentation)
                    for k, v in b.items():
                        n.free[k] += v
                return None
            for k, v in bundle.items():
                node.free[k] -= v
            taken.append((node, bundle))
            placed.append(node.node_id)
        for k in KEYS:
            self.free_total[k] -= need[k]
        return placed

    # --- failures -----------------------------------------------------------------------

    def lose_busiest_node(self) -> str | None:
        """Kill the node holding the most bundles of created groups (a loss that hurts); its id."""
        with self.lock:
            held: dict[str, int] = {}
            for g in self.groups.values():
                if g.state == "CREATED":
                    for node_id in g.nodes:
                        held[node_id] = held.get(node_id, 0) + 1
            if not held:
                return None
            node = self.nodes[max(held, key=lambda n: held[n])]
            node.alive = False
            for k in KEYS:
                self.free_total[k] -= node.free[k]
            for g in self.groups.values():
                if g.state == "CREATED" and node.node_id in g.nodes:
                    g.broken = True
            self.lost_nodes += 1
            return node.node_id


def creator_loop(fleet: Fleet, stop: threading.Event) -> None:
    """Ray's GCS creating placement groups one after another."""
    while not stop.is_set():
        took = fleet.create_next()
        time.sleep(took if took > 0 else 0.01)
