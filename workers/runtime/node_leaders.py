"""One rank per node speaks for the node: the supervisor polls it alone, as torchrun has one agent per node.

A poll that called every rank made 4,096 calls every 0.25 s for a 4,096-rank job (16,000 calls/s,
beyond what one Ray caller sustains); through the node leaders it makes one call per node. The
other ranks of a node hand their events to their leader (workers/runtime/actor.py `relay`), at
most one hand-over in flight each, and flush before their train() returns, so nothing a rank
reported is missing from the poll that follows its end. A follower keeps what it handed over until
a leader's poll took it: if the leader dies, WorkerGroup.poll polls the node's other ranks
themselves from then on, and they answer first with what the leader held unpolled.
"""

from __future__ import annotations


def node_leaders(nodes: list[str]) -> dict[int, list[int]]:
    """Leader rank -> the ranks on its node (itself first), for ranks placed on `nodes` (by rank);
    the lowest rank of each node leads it."""
    leaders: dict[str, int] = {}
    groups: dict[int, list[int]] = {}
    for rank, node in enumerate(nodes):
        leader = leaders.setdefault(node, rank)
        groups.setdefault(leader, []).append(rank)
    return groups


def leader_of(nodes: list[str]) -> list[int]:
    """Each rank's leader (a leader is its own)."""
    out = [0] * len(nodes)
    for leader, ranks in node_leaders(nodes).items():
        for rank in ranks:
            out[rank] = leader
    return out
