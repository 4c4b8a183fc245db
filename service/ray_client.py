"""Connecting to Ray: an existing cluster (TRAINYARD_RAY_ADDRESS) or a local one started here."""

from __future__ import annotations

import os

import ray

from service.settings import Settings

NAMESPACE = "trainyard"


def project_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def connect(settings: Settings) -> None:
    if ray.is_initialized():
        return
    # Workers import the project from this checkout, and the test tree for user entrypoints.
    env = {"PYTHONPATH": os.pathsep.join(p for p in [project_root(), os.environ.get("PYTHONPATH", "")] if p)}
    common = dict(namespace=NAMESPACE, log_to_driver=False, runtime_env={"env_vars": env})
    if settings.ray_address:
        ray.init(address=settings.ray_address, **common)
    else:
        # address="local": always a fresh cluster of our own, never one that `ray start` left behind.
        ray.init(address="local", num_cpus=settings.ray_num_cpus, include_dashboard=False, **common)
