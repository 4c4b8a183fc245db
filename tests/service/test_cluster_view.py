"""The cluster's size for "can never run": live nodes, and nodes lost within the grace that no live node
replaced at their address (service/cluster_view.py), from `ray.nodes()`-shaped records."""

from __future__ import annotations

from service.cluster_view import ClusterView


def node(node_id: str, address: str, alive: bool, cpus: float = 4.0, gpus: float = 0.0) -> dict:
    resources = {"CPU": cpus, "GPU": gpus} if alive else {}  # Ray lists a dead node without its resources
    return {"NodeID": node_id, "NodeManagerAddress": address, "Alive": alive, "Resources": resources}


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_lost_node_counts_until_the_grace_ends():
    clock = Clock()
    view = ClusterView(grace_s=60, clock=clock)
    assert view.observe([node("a", "10.0.0.1", True), node("b", "10.0.0.2", True, cpus=8)]) == (
        {"CPU": 12.0, "GPU": 0.0}, {"CPU": 8.0, "GPU": 0.0})
    clock.now = 59
    assert view.observe([node("a", "10.0.0.1", True), node("b", "10.0.0.2", False)])[0]["CPU"] == 12.0
    clock.now = 61
    assert view.observe([node("a", "10.0.0.1", True), node("b", "10.0.0.2", False)]) == (
        {"CPU": 4.0, "GPU": 0.0}, {"CPU": 4.0, "GPU": 0.0})


def test_a_node_back_at_its_address_replaces_its_lost_incarnation():
    clock = Clock()
    view = ClusterView(grace_s=60, clock=clock)
    view.observe([node("a", "10.0.0.1", True), node("b", "10.0.0.2", True)])
    clock.now = 5
    restarted = [node("a", "10.0.0.1", True), node("b", "10.0.0.2", False), node("b2", "10.0.0.2", True, gpus=1)]
    assert view.observe(restarted) == ({"CPU": 8.0, "GPU": 1.0}, {"CPU": 4.0, "GPU": 1.0})


def test_without_a_grace_only_live_nodes_count_and_a_node_never_seen_alive_is_nothing():
    view = ClusterView(grace_s=0, clock=Clock())
    assert view.observe([node("a", "10.0.0.1", True), node("x", "10.0.0.9", False)]) == (
        {"CPU": 4.0, "GPU": 0.0}, {"CPU": 4.0, "GPU": 0.0})
    assert view.observe([]) == ({"CPU": 0.0, "GPU": 0.0}, {"CPU": 0.0, "GPU": 0.0})


def test_a_node_that_shares_a_lost_nodes_address_from_before_does_not_replace_it():
    """Several raylets of one host share its address: the head, up all along, is not the lost one back."""
    clock = Clock()
    view = ClusterView(grace_s=60, clock=clock)
    view.observe([node("head", "10.0.0.1", True, cpus=1), node("b", "10.0.0.1", True, cpus=2)])
    clock.now = 5
    assert view.observe([node("head", "10.0.0.1", True, cpus=1), node("b", "10.0.0.1", False)])[0]["CPU"] == 3.0
