"""One rank per node speaks for the node: the supervisor polls it alone, as torchrun has one agent per node.

A poll that called every rank made 4,096 calls every 0.25 s for a 4,096-rank job (16,000 calls/s,
beyond what one Ray caller sustains); through the node leaders it makes one call per node. The
other ranks of a node hand their events to their leader (workers/runtime/actor.py `relay`), at
most one hand-over in flight each, and flush before their train() returns, so nothing a rank
reported is missing from the poll that follows its end. A follower keeps what it handed over until
a leader's poll took it: if the leader dies, WorkerGroup.poll polls the node's other ranks
themselves from then on, and they answer first with what the leader held unpolled.

A job that spans more than MAX_LEADERS nodes (its ranks packed over partly free nodes) gets a
two-level tree instead: neighbouring nodes, in rank order, share one leader, so a poll never makes
more than MAX_LEADERS calls whatever the job's size or how it was placed.
"""

from __future__ import annotations

import math

# The most calls a supervisor's poll makes: at a poll every 0.25 s, 2,048 calls/s, a quarter of what
# one Ray caller sustains (~8,000/s).
MAX_LEADERS = 512


def node_leaders(nodes: list[str], max_leaders: int = MAX_LEADERS) -> dict[int, list[int]]:
    """Leader rank -> the ranks it speaks for (itself first), for ranks placed on `nodes` (by rank):
    the lowest rank of each node leads it; past `max_leaders` nodes, each leader speaks for
    ceil(nodes / max_leaders) neighbouring nodes (in order of their lowest rank)."""
    order: dict[str, int] = {}  # node -> its index in order of first rank
    for node in nodes:
        order.setdefault(node, len(order))
    per_leader = max(1, math.ceil(len(order) / max_leaders))
    leaders: dict[int, int] = {}  # group index -> leader rank
    groups: dict[int, list[int]] = {}
    for rank, node in enumerate(nodes):
        leader = leaders.setdefault(order[node] // per_leader, rank)
        groups.setdefault(leader, []).append(rank)
    return groups


def leader_of(nodes: list[str], max_leaders: int = MAX_LEADERS) -> list[int]:
    """Each rank's leader (a leader is its own)."""
    out = [0] * len(nodes)
    for leader, ranks in node_leaders(nodes, max_leaders).items():
        for rank in ranks:
            out[rank] = leader
    return out
