"""One Ray node of the test bed: `ray start --block` inside the node's network namespace and a mount
namespace of its own, where fresh tmpfs hide the host's /tmp, /dev/shm and the storage path.

So a node sees the host's binaries and source tree (the venv, PYTHONPATH) but not one byte another
node or the control plane wrote under those paths, and a node killed and started again comes back
with empty disks, like a replaced machine.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.sharenothing.network import ip

KEEP_ROOT = "/run/trainyard-bed-keep"  # outside every private path; only empty directories stay on the host
RAY_PORT = 6379  # the GCS port: every node has its own network namespace, so the default cannot collide
OBJECT_STORE_BYTES = 100 * 1024**2  # small: five beds' worth of nodes share 24 GiB with other test runs
HEAD_ENV = {
    # The GCS marks a killed node dead after period x threshold (the defaults take ~30 s).
    "RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3", "RAY_health_check_initial_delay_ms": "1000",
    # Ray Client's server starts a driver process per client and gives it 30 s, which a loaded machine misses.
    "RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S": "180",
}


@dataclass
class NodeSpec:
    name: str
    namespace: str
    address: str
    head_address: str  # the head's IP; the head's own spec carries its own IP here
    num_cpus: int
    private_paths: tuple[str, ...]
    log: Path
    # Host directories the node must still see even when they lie under a private path: the source tree
    # and the venv (a checkout under /tmp, as CI may have, would otherwise vanish under the node's tmpfs).
    keep_paths: tuple[str, ...] = ()
    resources: dict[str, float] = field(default_factory=dict)

    @property
    def hostname(self) -> str:
        return f"{self.namespace}"

    @property
    def is_head(self) -> bool:
        return self.address == self.head_address

    def ray_start(self) -> list[str]:
        import json

        args = [str(Path(sys.executable).with_name("ray")), "start", "--block", "--disable-usage-stats",
                f"--node-ip-address={self.address}", f"--num-cpus={self.num_cpus}", "--num-gpus=0",
                f"--object-store-memory={OBJECT_STORE_BYTES}", "--temp-dir=/tmp/ray",
                f"--resources={json.dumps(self.resources)}"]
        if self.is_head:
            return args + ["--head", f"--port={RAY_PORT}", "--include-dashboard=false"]
        return args + [f"--address={self.head_address}:{RAY_PORT}"]

    def command(self) -> list[str]:
        """ip netns exec -> unshare -m -> sh (mounts the private tmpfs) -> exec ray start: one process
        tree, every member of it in the node's network namespace, where `ip netns pids` finds it."""
        mounts = [f"mkdir -p {shlex.quote(p)} && mount -t tmpfs -o size=1g,mode=1777 bed-{self.name} {shlex.quote(p)}"
                  for p in self.private_paths]
        # Each kept directory is bound aside before the tmpfs cover it, and bound back on top after.
        kept = [(p, f"{KEEP_ROOT}/{i}") for i, p in enumerate(self._covered_keep_paths())]
        aside = [f"mkdir -p {h} && mount --bind {shlex.quote(p)} {h}" for p, h in kept]
        back = [f"mkdir -p {shlex.quote(p)} && mount --bind {h} {shlex.quote(p)}" for p, h in kept]
        # A host name of its own that resolves to the node's address, as on a real machine: gloo binds to
        # the address its host name resolves to, and the host's name means nothing in this namespace.
        host = [f"hostname {self.hostname}",
                f"printf '127.0.0.1 localhost\\n{self.address} {self.hostname}\\n' > /tmp/.bed-hosts",
                "mount --bind /tmp/.bed-hosts /etc/hosts"]
        script = " && ".join(aside + mounts + back + host + [f"exec {shlex.join(self.ray_start())}"])
        return ["ip", "netns", "exec", self.namespace, "unshare", "--mount", "--uts", "--propagation", "private",
                "sh", "-c", script]


    def _covered_keep_paths(self) -> list[str]:
        """The kept paths a private path would hide, outermost only (a venv inside the checkout goes with it)."""
        def under(path: str, roots) -> bool:
            return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)
        covered = sorted({p for p in self.keep_paths if under(p, self.private_paths)}, key=len)
        return [p for i, p in enumerate(covered) if not under(p, covered[:i])]


class Node:
    """A node's processes: start, SIGKILL every one of them, and wait until none is left."""

    def __init__(self, spec: NodeSpec, env: dict[str, str]):
        self.spec, self.env = spec, env
        self.proc: subprocess.Popen | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def ip(self) -> str:
        return self.spec.address

    def start(self) -> None:
        env = {**self.env, **(HEAD_ENV if self.spec.is_head else {})}
        self.spec.log.parent.mkdir(parents=True, exist_ok=True)
        with self.spec.log.open("ab") as log:
            self.proc = subprocess.Popen(self.spec.command(), env=env, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def pids(self) -> list[int]:
        """Every live process in the node's network namespace, whoever started it (Ray's daemons and workers)."""
        listed = ip("netns", "pids", self.spec.namespace, check=False).stdout.split()
        return [int(p) for p in listed]

    def exited_early(self) -> str | None:
        """The end of the node's log, if `ray start --block` has already returned. It also returns after
        giving its raylet a fixed 30 s to register, and a raylet that registers later stays and serves:
        only the GCS says whether a node is up."""
        if self.proc is not None and self.proc.poll() is not None:
            return f"node {self.name} exited with {self.proc.returncode}:\n{self.spec.log.read_text()[-3000:]}"
        return None

    def files(self, path: str) -> list[str]:
        """The files under `path` as this node sees them (its private tmpfs), read through its mount namespace."""
        # Any process of the node will do: all of them descend from the `unshare` that made its mount namespace.
        if not (pids := self.pids()):
            raise RuntimeError(f"node {self.name} is not running")
        found = subprocess.run(["nsenter", f"--target={pids[0]}", "--mount", "find", path, "-type", "f"],
                               capture_output=True, text=True)
        return sorted(found.stdout.split())

    def kill(self, timeout_s: float = 30) -> None:
        """SIGKILL, as a machine that loses power: no Ray shutdown, the GCS finds out by its health checks."""
        deadline = time.monotonic() + timeout_s
        while pids := self.pids():
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {self.name}: processes {pids} survive SIGKILL after {timeout_s} s")
            time.sleep(0.1)
        if self.proc is not None:
            self.proc.wait(timeout=timeout_s)  # reap our own child; the rest were reparented and reaped by init
            self.proc = None
