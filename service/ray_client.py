"""Connecting to Ray: an existing cluster (TRAINYARD_RAY_ADDRESS) or a local one started here."""

from __future__ import annotations

import logging
import os

import ray

from service.settings import Settings

NAMESPACE = "trainyard"
log = logging.getLogger("trainyard.ray")


def project_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker_env() -> dict[str, str]:
    """The environment of every Ray worker this driver starts (the job's runtime_env)."""
    return {
        # Workers import the project from this checkout, and the test tree for user entrypoints.
        "PYTHONPATH": os.pathsep.join(p for p in [project_root(), os.environ.get("PYTHONPATH", "")] if p),
        # Ray starts workers at nice 15, below its own daemons and every other process on the node;
        # a training rank is the node's main work, and a rank preempted for a moment stalls every
        # collective of its group (torchrun's ranks run at nice 0). Ray Jobs does the same for its drivers.
        # A rank actor whose loop trains in a child steps aside once the child is forked
        # (workers/runtime/step_aside.py): the loop keeps nice 0.
        "RAY_worker_niceness": "0",
        # A crashing rank prints its C++ stack, whatever its driver chose for itself (api/cli/remote.py).
        "RAY_DISABLE_FAILURE_SIGNAL_HANDLER": "0",
    }


def connect(settings: Settings) -> None:
    if ray.is_initialized():
        return
    common = dict(namespace=NAMESPACE, log_to_driver=False, runtime_env={"env_vars": worker_env()})
    if settings.ray_address:
        ray.init(address=settings.ray_address, **common)
    else:
        # address="local": always a fresh cluster of our own, never one that `ray start` left behind.
        ray.init(address="local", num_cpus=settings.ray_num_cpus, include_dashboard=False, **common)


def local_ray_processes() -> list[int]:
    """Every process of the local Ray that `connect` started: its daemons and, below the raylet,
    the agents and worker processes. Taken before the thread that started Ray ends: the daemons
    die with that thread (Ray starts them with a parent-death signal, which Linux sends when the
    parent *thread* exits), and their children would be orphans no tree leads to."""
    from service.process_tree import descendants

    node = getattr(ray._private.worker, "_global_node", None)
    daemons = [proc.pid for _, proc in node.live_processes()] if node is not None else []
    return daemons + [pid for daemon in daemons for pid in descendants(daemon)]


def stop_local_ray(processes: list[int] | None = None, timeout_s: float = 30.0) -> None:
    """Shut down the local Ray and wait until every process of it (`local_ray_processes()`, by
    default taken now) has exited, so that its owner returns with nothing of its Ray running."""
    from service.process_tree import wait_gone

    tree = local_ray_processes() if processes is None else processes
    ray.shutdown()
    killed = wait_gone(tree, timeout_s)
    log.info("local Ray stopped: %d processes exited%s", len(tree),
             f", {len(killed)} killed after {timeout_s:.0f} s" if killed else "")
