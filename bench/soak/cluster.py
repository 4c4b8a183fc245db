"""The soak's Ray: a head without CPUs and a few small worker nodes on this machine, one of which the
chaos schedule removes (SIGKILL of its raylet and ranks) and later brings back.

Built on `ray.cluster_utils.Cluster`, as tests/service/elastic_scenario.py and bench/recovery.py do.
Ray starts a node's daemons with a parent-death signal bound to the *thread* that started them, so
every call here must come from the thread that lives for the whole soak (the main one)."""

from __future__ import annotations

import time

import ray
from ray.cluster_utils import Cluster

from service.ray_client import NAMESPACE


class RayNodes:
    def __init__(self, nodes: int, cpus_per_node: int):
        self.cpus = cpus_per_node
        self.cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
        self.workers = [self.cluster.add_node(num_cpus=cpus_per_node) for _ in range(nodes)]
        self.cluster.wait_for_nodes()
        # the soak's own driver: it kills supervisors by name, as an operator with `ray kill` would
        ray.init(address=self.cluster.address, namespace=NAMESPACE, log_to_driver=False)

    @property
    def address(self) -> str:
        return self.cluster.address

    def remove_one(self, index: int) -> None:
        """SIGKILL a worker node's raylet and everything on it: its ranks die mid-step."""
        node = self.workers.pop(index % len(self.workers))
        self.cluster.remove_node(node, allow_graceful=False)

    def add_one(self) -> None:
        self.workers.append(self.cluster.add_node(num_cpus=self.cpus))
        self.cluster.wait_for_nodes()

    def kill_actor(self, name: str) -> bool:
        """ray.kill a named actor (a job's supervisor); False if no such actor is alive."""
        try:
            ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
            return True
        except ValueError:
            return False

    def shutdown(self) -> None:
        ray.shutdown()
        self.cluster.shutdown()
        time.sleep(0.5)
