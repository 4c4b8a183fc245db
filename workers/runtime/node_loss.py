"""Was a rank lost with its node? Asked when a rank's actor died or stopped answering.

A SIGKILLed raylet is declared dead by Ray only after several missed health checks (14-15 s on
this machine, longer under load). Until then its node still offers its resources, so a group
formed at once may be placed on it again and fail at start: another restart spent on one fault.
So the answer waits for Ray to decide, and a quick task pinned to the node says "alive" as soon
as it runs. A node declared dead makes the restart `node_lost` (the cluster's budget); a live one,
or no verdict in time, leaves the rank's own failure (`worker_lost`, the job's budget)."""

from __future__ import annotations

import time
from collections.abc import Callable

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

NODE_VERDICT_WAIT_S = 60.0  # Ray's default health checks declare a node dead after ~15-30 s


@ray.remote(num_cpus=0, max_retries=0)
def _here() -> bool:
    return True


def node_dead(node_id: str) -> bool:
    """Ray's view now: the node is known and not alive."""
    return any(n["NodeID"] == node_id and not n["Alive"] for n in ray.nodes())


def node_lost(node_id: str | None, wait_s: float = NODE_VERDICT_WAIT_S, poll_s: float = 0.5,
              interrupted: Callable[[], bool] = lambda: False) -> bool:
    """True once Ray declares the node dead; False as soon as a task runs there, after `wait_s`, or
    once `interrupted()` (the job is being cancelled: the cause no longer matters)."""
    if node_id is None:
        return False
    probe = _here.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()
    deadline = time.monotonic() + wait_s
    answered = False
    try:
        while time.monotonic() < deadline and not interrupted():
            if node_dead(node_id):
                return True
            ready, _ = ray.wait([probe], timeout=poll_s)
            if ready:
                answered = True
                try:
                    ray.get(ready[0])
                    return False  # something ran there: the node lives, the rank alone was lost
                except ray.exceptions.RayError:
                    return node_dead(node_id)  # unschedulable: the node went away meanwhile
        return False
    finally:
        if not answered:  # still queued for the node (or running on one that stopped answering)
            try:  # not force=True: that kills the worker running it, needlessly, on a live node
                ray.cancel(probe)
            except Exception:  # finished meanwhile, or its node is gone
                pass
