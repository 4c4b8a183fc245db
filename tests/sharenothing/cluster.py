"""The share-nothing Ray cluster: a head and N workers, each a `Node` in its own namespaces on one bridge.

    bed = ShareNothingCluster(workdir, workers=2).start()
    bed.ray_address            # "10.231.x.10:6379", the head's GCS, over the bridge
    bed.client_address         # "ray://10.231.x.10:10001", for a driver that is not a Ray node
    bed.host_ip                # the root namespace's bridge address: where nodes reach host services
    bed.node_resource("w1")    # a custom resource only node w1 has: pins an actor to that node
    bed.kill_node("w1"); bed.wait_node_state("w1", alive=False); bed.restart_node("w1")
    bed.on_stop(ctx.disconnect) # run first thing in stop(), while the head is still up
    bed.stop()                 # every process gone, namespaces and bridge deleted, asserted
"""

from __future__ import annotations

import os
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.sharenothing.network import Network, require_netns
from tests.sharenothing.node import RAY_PORT, Node, NodeSpec


class NodeExited(RuntimeError):
    """A node's `ray start --block` returned: it failed to start, or its daemons died."""


CLIENT_PORT = 10001  # Ray Client's server on the head
HEAD = "head"


class ShareNothingCluster:
    def __init__(self, workdir: Path, workers: int = 2, num_cpus: int = 4, storage_path: str | None = None,
                 head_cpus: int | None = None):
        require_netns()
        self.workdir = Path(workdir)
        # The path jobs store under (TRAINYARD_STORAGE_URI): the host's directory for the control plane,
        # a private tmpfs on each node. /tmp and /dev/shm are private on the nodes too.
        self.storage_path = storage_path or str(self.workdir / "storage")
        self.network = Network(tag="ty" + secrets.token_hex(2))
        self.num_cpus = num_cpus
        self.head_cpus = num_cpus if head_cpus is None else head_cpus  # 0: no rank ever lands on the head
        self.names = [HEAD] + [f"w{i}" for i in range(1, workers + 1)]
        self.nodes: dict[str, Node] = {}
        self._before_stop: list[Callable[[], None]] = []

    # -- addresses ------------------------------------------------------------------------------
    @property
    def host_ip(self) -> str:
        return self.network.host_ip

    @property
    def head_ip(self) -> str:
        return self.network.addresses[HEAD]

    @property
    def ray_address(self) -> str:
        return f"{self.head_ip}:{RAY_PORT}"

    @property
    def client_address(self) -> str:
        return f"ray://{self.head_ip}:{CLIENT_PORT}"

    def node_ip(self, name: str) -> str:
        return self.network.addresses[name]

    def node_resource(self, name: str) -> str:
        return f"bed_node_{name}"

    def control_plane_env(self) -> dict[str, str]:
        """What a `trainyard serve` in the root namespace needs to run jobs on the bed: Ray Client, because
        a driver attaches to a raylet of its own machine by Unix sockets, which are private to each node."""
        return {"TRAINYARD_RAY_ADDRESS": self.client_address, "RAY_AUTH_MODE": "disabled"}

    def files_on(self, name: str, path: str | None = None) -> list[str]:
        """The files node `name` holds under `path` (default: the storage path) on its private disk."""
        return self.nodes[name].files(path or self.storage_path)

    # -- lifecycle ------------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """The nodes' environment: this interpreter's venv and source tree, nothing of the caller's Ray."""
        root = str(Path(__file__).resolve().parents[2])
        pythonpath = os.pathsep.join(p for p in [root, os.environ.get("PYTHONPATH", "")] if p)
        keep = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "TRAINYARD_"))}
        # RAY_AUTH_MODE: `ray start` turns token auth on whenever ~/.ray/auth_token exists, a file any local
        # ray.init() on this machine may create or replace; the bed's private subnet needs no token.
        return {**keep, "PYTHONPATH": pythonpath, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
                "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}

    def _spec(self, name: str) -> NodeSpec:
        return NodeSpec(name=name, namespace=self.network.namespaces[name], address=self.node_ip(name),
                        head_address=self.head_ip, num_cpus=self.head_cpus if name == HEAD else self.num_cpus,
                        private_paths=("/tmp", "/dev/shm", self.storage_path),
                        log=self.workdir / "logs" / f"{name}.log", resources={self.node_resource(name): 1},
                        keep_paths=(str(Path(__file__).resolve().parents[2]), sys.prefix))

    def start(self, timeout_s: float = 180) -> "ShareNothingCluster":
        try:
            self.network.create_bridge()
            for name in self.names:
                self.network.add_node(name)
            for name in self.names:
                self.nodes[name] = Node(self._spec(name), self.env())
            self._bring_up([HEAD], timeout_s)
            self._bring_up(self.names[1:], timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _bring_up(self, names: list[str], timeout_s: float, attempts: int = 3) -> None:
        """Start the nodes together and wait until each is alive. `ray start` gives a raylet a fixed 30 s
        to register, which a machine loaded by other test runs can miss: such a node exits, and is
        cleared and started again, up to `attempts` times."""
        for name in names:
            self.nodes[name].start()
        for name in names:
            for attempt in range(1, attempts + 1):
                try:
                    self.wait_node_state(name, alive=True, timeout_s=timeout_s)
                    break
                except NodeExited:
                    if attempt == attempts:
                        raise
                    self.nodes[name].kill()
                    self.nodes[name].start()

    def on_stop(self, callback: Callable[[], None]) -> None:
        """Run `callback` once, at the start of `stop()` (e.g. disconnect a Ray Client while the head is up)."""
        self._before_stop.append(callback)

    def stop(self) -> None:
        """Kill every node (workers first, so that the GCS outlives them), delete the network, check it is all gone."""
        while self._before_stop:
            self._before_stop.pop()()
        for name in reversed(self.names):
            if name in self.nodes:
                self.nodes[name].kill()
        left = self.network.delete()
        alive = {n: node.pids() for n, node in self.nodes.items() if node.pids()}
        assert not left and not alive, f"the test bed left namespaces/links {left} and processes {alive}"

    def kill_node(self, name: str) -> None:
        assert name != HEAD, "killing the head ends the cluster; kill a worker"
        self.nodes[name].kill()

    def restart_node(self, name: str, timeout_s: float = 120) -> None:
        """The same namespace and IP, fresh processes and empty private disks (a new Ray node ID)."""
        self._bring_up([name], timeout_s)

    # -- state ----------------------------------------------------------------------------------
    def node_states(self) -> dict[str, bool]:
        """Node IP -> alive, from the GCS; a restarted node's IP is alive if any of its incarnations is."""
        from ray._raylet import GcsClient  # type: ignore[attr-defined]

        states: dict[str, bool] = {}
        for info in GcsClient(address=self.ray_address).get_all_node_info(timeout=10).values():
            ip, alive = info.node_manager_address, info.state == 0  # GcsNodeState.ALIVE
            states[ip] = states.get(ip, False) or alive
        return states

    def wait_node_state(self, name: str, alive: bool, timeout_s: float = 60) -> float:
        """Until the GCS reports node `name` alive (or dead); returns the seconds it took."""
        start, ip = time.monotonic(), self.node_ip(name)
        last: object = None
        while time.monotonic() - start < timeout_s:
            try:
                if self.node_states().get(ip, False) == alive:
                    return time.monotonic() - start
            except Exception as e:  # the GCS is not up yet
                last = e
            if (early := self.nodes[name].exited_early()) and alive:
                raise NodeExited(early)
            time.sleep(0.5)
        raise TimeoutError(f"node {name} ({ip}) not {'alive' if alive else 'dead'} after {timeout_s} s "
                           f"(last error: {last}); log {self.nodes[name].spec.log}")
