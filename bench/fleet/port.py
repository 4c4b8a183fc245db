"""The cluster port (service/cluster_port.py) on the simulated cluster: what the control plane runs on.

Every call crosses to the cluster process (bench/fleet/cluster_process.py) over one connection,
pickled both ways, as Ray's calls cross to its GCS and actors. Supervisor handles keep Ray's calling
convention: `handle.drain.remote(ack)` returns a reference that `gather` resolves, many at once in
one round trip; other methods (start, cancel, preempt) are sent and answered at once and run after, in order, as Ray
queues them on the actor.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Client, Connection
from typing import Any

from bench.fleet.pass_time import waiting_on
from service.cluster_port import K, Reply, ReplyKind
from workers.runtime.group_owner import GroupOwner

DEFERRED = frozenset({"drain", "ready", "status"})  # answered through gather
_call_ids = itertools.count(1)
ANSWER_GRACE_S = 0.05  # past the gather's deadline, for the answers begun before it to come back


@dataclass(frozen=True)
class Call:
    """A deferred method call: the reference `.remote()` returns."""

    name: str
    method: str
    args: tuple
    id: int = field(default_factory=lambda: next(_call_ids))  # one reference, gathered again if it was late


@dataclass(frozen=True)
class Done:
    """A call already answered."""

    value: Any


class _Method:
    def __init__(self, cluster: SimulatedClusterPort, name: str, method: str):
        self.cluster, self.name, self.method = cluster, name, method

    def remote(self, *args) -> Call | Done:
        if self.method in DEFERRED:
            return Call(self.name, self.method, args)
        return Done(self.cluster.rpc("call", self.name, self.method, args))


class Handle:
    def __init__(self, cluster: SimulatedClusterPort, name: str):
        self.cluster, self.name = cluster, name

    def __getattr__(self, method: str) -> _Method:
        return _Method(self.cluster, self.name, method)


class SimulatedClusterPort:
    """The cluster port over one connection per calling thread: Ray answers its callers' threads
    concurrently, so the scheduler's calls do not queue behind the reconciler's gather (the cluster
    process serves each connection on a thread of its own)."""

    def __init__(self, address: tuple[str, int], authkey: bytes):
        self.address, self.authkey = address, authkey
        self._connected = False
        self._local = threading.local()
        self._conns: list[Connection] = []
        self._lock = threading.Lock()  # around the connection list and the counters
        self.calls = 0
        # thread -> seconds the cluster process spent answering this thread's gathers one after another
        # beyond the slowest answer of each (bench/fleet/cluster_process.py `gather`)
        self.serial_s: dict[str, float] = {}

    def rpc(self, op: str, *args, deadline: float | None = None) -> Any:
        """One call to the cluster process. With a `deadline` (monotonic), TimeoutError if its answer is
        not back by then, as `ray.wait` returns on time however slow the actors: the connection is
        dropped (its late answer with it) and the next call opens a new one."""
        conn = self._thread_conn()
        with waiting_on("cluster_wait", op):  # the calling pass's wait for the cluster process
            conn.send((op, args))
            if deadline is not None and not conn.poll(max(0.0, deadline - time.monotonic())):
                self._local.conn = None
                conn.close()
                raise TimeoutError(f"simulated cluster: {op}: no answer by the deadline")
            ok, value = conn.recv()
        with self._lock:
            self.calls += 1
        if not ok:
            raise RuntimeError(f"simulated cluster: {op}: {value}")
        return value

    def _thread_conn(self) -> Connection:
        if not self._connected:
            raise ConnectionError("not connected to the simulated cluster")
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._open()
            with self._lock:
                self._conns.append(conn)
        return conn

    def _open(self) -> Connection:
        deadline = time.monotonic() + 30
        while True:
            try:
                return Client(self.address, authkey=self.authkey)
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def connect(self) -> None:
        self._connected = True
        self._thread_conn()

    def release(self) -> None:
        self._connected = False
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            conn.close()
        self._local = threading.local()

    def nodes(self) -> list[dict]:
        return self.rpc("nodes")

    def available_resources(self) -> dict[str, float]:
        return self.rpc("available")

    def available_per_node(self) -> dict[str, dict[str, float]]:
        return self.rpc("available_per_node")

    def created_group_owners(self) -> set[GroupOwner]:
        return {owner for g in self.rpc("groups").values() if g["state"] == "CREATED"
                if (owner := GroupOwner.of_group(g["name"])) is not None}

    def placement_groups(self) -> dict[str, dict]:
        return self.rpc("groups")

    def remove_placement_group(self, group_id: str) -> bool:
        return self.rpc("remove_group", group_id)

    def create_supervisor(self, name: str) -> Handle:
        return Handle(self, self.rpc("create", name))

    def find_supervisor(self, name: str | None) -> Handle | None:
        return Handle(self, name) if name and self.rpc("find", name) else None

    def named_actors(self) -> list[str]:
        return self.rpc("named")

    def kill(self, handle: Any) -> None:
        self.rpc("kill", handle.name)

    def gather(self, refs: dict[K, Any], timeout_s: float) -> dict[K, Reply]:
        replies: dict[K, Reply] = {k: Reply(ReplyKind.ANSWERED, r.value)
                                   for k, r in refs.items() if isinstance(r, Done)}
        calls = [(k, r.id, r.name, r.method, r.args) for k, r in refs.items() if isinstance(r, Call)]
        if calls:
            deadline = time.monotonic() + timeout_s
            try:
                answered, serial_s = self.rpc("gather", calls, deadline, deadline=deadline + ANSWER_GRACE_S)
            except TimeoutError as exc:  # the cluster process did not get to it: nothing back this time
                answered, serial_s = [(key, ReplyKind.NO_ANSWER.value, None, str(exc)) for key, *_ in calls], 0.0
            for key, kind, value, error in answered:
                replies[key] = Reply(ReplyKind(kind), value, error)
            thread = threading.current_thread().name
            self.serial_s[thread] = self.serial_s.get(thread, 0.0) + serial_s
        return replies
