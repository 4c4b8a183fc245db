"""The simulated cluster, in a process of its own (as Ray's GCS, raylets and actors are to the service).

`python -m bench.fleet.cluster_process --port P --authkey-hex K ...` serves the cluster port's calls
(bench/fleet/port.py sends them) on each connection: Ray's view of nodes and placement groups
(bench/fleet/nodes.py), and the supervisors: the service's own `Supervisor` and `JobRun`
(service/supervisor/), each run on a simulated worker group (bench/fleet/ranks.py) in its own
thread, as a supervisor actor runs its JobRun. Only the cluster and the ranks are simulated.
"""

from __future__ import annotations

import argparse
import logging
import queue
import threading
import time
from functools import partial
from multiprocessing.connection import Connection, Listener
from typing import Any

from bench.fleet.nodes import Fleet, creator_loop
from bench.fleet.ranks import PollCounter, group_factory
from bench.fleet.sizes import deep_size
from service.supervisor.actor import Supervisor
from service.supervisor.run import JobRun
from workers.spec import JobSpec

GONE, ANSWERED, FAILED, NO_ANSWER = "gone", "answered", "failed", "no_answer"
LATE_KEPT_S = 120.0  # a late answer nobody gathered again within this long is dropped (its job ended)


class SimulatedCluster:
    def __init__(self, fleet: Fleet, step_s: float, straggler_every: int):
        self.fleet, self.polls = fleet, PollCounter()
        self.supervisors: dict[str, Supervisor] = {}
        self.lock = threading.Lock()
        # Calls past their gather's deadline go on in the background, as Ray's actors go on answering
        # after the caller's ray.wait returned: call id -> (kind, value, error, when), or None while running.
        self.late: dict[int, tuple[str, Any, str, float] | None] = {}
        self.queued_calls: queue.SimpleQueue = queue.SimpleQueue()  # calls sent with .remote(), run in order
        threading.Thread(target=self._run_calls, name="actor-calls", daemon=True).start()

        def slow_ranks(spec: JobSpec) -> dict[int, float]:
            # every `straggler_every`-th rank of a large job computes 1.6x slower: the watch must name it
            return {r: 1.6 for r in range(straggler_every - 1, spec.world_size, straggler_every)} \
                if spec.world_size >= 2 * straggler_every else {}

        self.make_run = partial(JobRun, group_factory=group_factory(fleet, self.polls, step_s, slow_ranks),
                                cluster=fleet)

    # --- the port's calls -----------------------------------------------------------------

    def create(self, name: str) -> str:
        with self.lock:
            self.supervisors.setdefault(name, Supervisor(self.make_run))
        return name

    def find(self, name: str) -> bool:
        return name in self.supervisors

    def named(self) -> list[str]:
        return list(self.supervisors)

    def kill(self, name: str) -> None:
        """As Ray kills an actor: the name is gone at once; its run stops and its workers and placement
        group go with it after the call returned (`ray.kill` asks the GCS and returns: the caller never
        waits for the teardown)."""
        with self.lock:
            sup = self.supervisors.pop(name, None)
        if sup is not None and sup._run is not None:
            threading.Thread(target=_tear_down, args=(sup._run,), name="kill", daemon=True).start()

    def call(self, name: str, method: str, args: tuple) -> None:
        """A method sent with `.remote()` and never gathered (start, cancel, preempt): queued and answered at
        once, run after on the actor-calls thread in the order sent, as Ray queues an actor's calls and
        returns a reference without waiting for them to run."""
        sup = self.supervisors.get(name)
        if sup is not None:
            self.queued_calls.put((name, sup, method, args))

    def _run_calls(self) -> None:
        while True:
            name, sup, method, args = self.queued_calls.get()
            try:
                getattr(sup, method)(*args)
            except Exception as exc:  # nobody waits for its answer: Ray would keep it in the reference
                logging.getLogger("bench.fleet").warning("%s.%s raised: %s: %s", name, method,
                                                         type(exc).__name__, exc)

    def gather(self, calls: list[tuple[Any, int, str, str, tuple]], deadline: float
               ) -> tuple[list[tuple[Any, str, Any, str]], float]:
        """The replies, and the seconds this process spent answering them one after another beyond
        the slowest one: Ray's actors answer in parallel, each on its own process, so a caller waits
        for the slowest, not for the sum (the simulator charges the pass that instead, serve.py).
        A call not begun by `deadline` (this host's monotonic clock, shared with the caller) is
        NO_ANSWER and runs in the background; gathered again (same call id), it returns its answer."""
        replies: list[tuple[Any, str, Any, str]] = []
        late: list[tuple[int, str, str, tuple]] = []
        total = slowest = 0.0
        for key, call_id, name, method, args in calls:
            if call_id in self.late:
                answer = self.late[call_id]
                if answer is None:
                    replies.append((key, NO_ANSWER, None, "still running"))
                else:
                    del self.late[call_id]
                    replies.append((key, *answer[:3]))
                continue
            if time.monotonic() >= deadline:
                self.late[call_id] = None
                late.append((call_id, name, method, args))
                replies.append((key, NO_ANSWER, None, "not answered by the deadline"))
                continue
            started = time.perf_counter()
            replies.append((key, *self._answer(name, method, args)))
            took = time.perf_counter() - started
            total, slowest = total + took, max(slowest, took)
        if late:
            threading.Thread(target=self._answer_late, args=(late,), name="late-answers", daemon=True).start()
        return replies, total - slowest

    def _answer(self, name: str, method: str, args: tuple) -> tuple[str, Any, str]:
        sup = self.supervisors.get(name)
        if sup is None:
            return GONE, None, f"the actor {name} is dead"
        try:
            return ANSWERED, True if method == "ready" else getattr(sup, method)(*args), ""
        except Exception as exc:  # the method raised, as a RayTaskError would say
            return FAILED, None, f"{type(exc).__name__}: {exc}"

    def _answer_late(self, calls: list[tuple[int, str, str, tuple]]) -> None:
        for call_id, name, method, args in calls:
            self.late[call_id] = (*self._answer(name, method, args), time.monotonic())
        old = time.monotonic() - LATE_KEPT_S
        for call_id, answer in list(self.late.items()):
            if answer is not None and answer[3] < old:
                self.late.pop(call_id, None)

    # --- the simulator's own calls ---------------------------------------------------------

    def lose_node(self) -> str | None:
        return self.fleet.lose_busiest_node()

    def supervisor_state(self, job_id: str) -> dict | None:
        """The deep size of the job's supervisor and the steps its run holds (for bytes per step)."""
        sup = next((s for s in list(self.supervisors.values()) if s.job_id == job_id), None)
        run = sup._run if sup is not None else None
        if run is None:
            return None
        # The record buffer holds what the control plane has not drained yet: bounded by the drain cadence,
        # not by the run's length, and sampled at a random point of it; counted apart.
        buffer = getattr(sup, "_records", None)
        return {"bytes": deep_size(sup, exclude=(Fleet, PollCounter, type(buffer))), "step": _last_step(run),
                "buffer_bytes": deep_size(buffer) if buffer is not None else 0}

    def supervisor_step(self, job_id: str) -> int | None:
        sup = next((s for s in list(self.supervisors.values()) if s.job_id == job_id), None)
        run = sup._run if sup is not None else None
        return _last_step(run) if run is not None else None

    def stats(self) -> dict:
        with self.polls.lock:
            per_poll, nodes = dict(self.polls.per_poll), dict(self.polls.nodes)
        return {"calls_per_poll": per_poll, "nodes_per_job": nodes, "poll_calls_total": self.polls.total,
                "lost_nodes": self.fleet.lost_nodes, "free": self.fleet.available(),
                "supervisors": len(self.supervisors)}


def _tear_down(run: JobRun) -> None:
    run.cancel()
    live = run._live
    if live is not None:
        live.group.shutdown()


def _last_step(run: JobRun) -> int:
    """The run's last step; also on the code before its step history (a list), for the before column."""
    steps: Any = run.steps
    return steps.last_step if hasattr(steps, "last_step") else (steps[-1]["step"] if steps else 0)


def serve(conn: Connection, cluster: SimulatedCluster) -> None:
    fleet = cluster.fleet
    handlers: dict[str, Any] = {"nodes": fleet.ray_nodes, "available": fleet.available, "groups": fleet.table,
                "available_per_node": fleet.available_per_node,
                "remove_group": fleet.remove, "create": cluster.create, "find": cluster.find,
                "named": cluster.named, "kill": cluster.kill, "call": cluster.call, "gather": cluster.gather,
                "lose_node": cluster.lose_node, "supervisor_state": cluster.supervisor_state,
                "supervisor_step": cluster.supervisor_step,
                "stats": cluster.stats}
    while True:
        try:
            op, args = conn.recv()
        except (EOFError, OSError):
            return
        try:
            answer = (True, handlers[op](*args))
        except Exception as exc:
            answer = (False, f"{type(exc).__name__}: {exc}")
        try:
            conn.send(answer)
        except OSError:  # the caller gave up on this answer and dropped the connection (port.py `rpc`)
            return


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--authkey-hex", required=True)
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--gpus-per-node", type=float, default=8)
    p.add_argument("--cpus-per-node", type=float, default=64)
    p.add_argument("--memory-gib-per-node", type=float, default=1024)
    p.add_argument("--groups-per-s", type=float, default=100.0)
    p.add_argument("--bundles-per-s", type=float, default=2000.0)
    p.add_argument("--step-s", type=float, default=1.0)
    p.add_argument("--straggler-every", type=int, default=512)
    a = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    fleet = Fleet(a.nodes, a.cpus_per_node, a.gpus_per_node, a.memory_gib_per_node * 2**30, a.groups_per_s,
                  a.bundles_per_s)
    cluster = SimulatedCluster(fleet, a.step_s, a.straggler_every)
    stop = threading.Event()
    threading.Thread(target=creator_loop, args=(fleet, stop), name="gcs-groups", daemon=True).start()
    with Listener(("127.0.0.1", a.port), authkey=bytes.fromhex(a.authkey_hex)) as listener:
        while True:  # the control plane's connection, and the simulator's own (node losses, figures)
            conn = listener.accept()
            threading.Thread(target=serve, args=(conn, cluster), daemon=True).start()


if __name__ == "__main__":
    main()
