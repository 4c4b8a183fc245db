"""Connecting to Ray: an existing cluster (TRAINYARD_RAY_ADDRESS) or a local one started here."""

from __future__ import annotations

import os

import ray

from service.settings import Settings

NAMESPACE = "trainyard"


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
        "RAY_worker_niceness": "0",
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
