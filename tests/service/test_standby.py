"""Standby supervisors on the session's real Ray: a job takes a ready one, else one still
starting (its start-up is under way, so it answers sooner than a new actor), else none."""

from __future__ import annotations

import ray

from service.ray_client import NAMESPACE
from service.ray_cluster import RayCluster
from service.settings import get_settings
from service.supervisor.standby import StandbyPool


def test_take_prefers_ready_then_starting_standbys(ray_cluster):
    pool = StandbyPool("test-take", size=1, cluster=RayCluster(get_settings()))
    taken = []
    try:
        pool.refill()
        taken.append(pool.take())  # still starting: handed over anyway
        name, handle = taken[0]
        assert name.startswith("trainyard-standby-test-take-")
        assert pool.take() is None  # nothing left to give, nothing doubled
        assert pool.names() == {name}  # lent: still the pool's to the orphan sweep until its job commits
        pool.settle(name)
        assert pool.names() == set()
        assert ray.get(handle.ready.remote(), timeout=120)  # the taken one finishes starting for its job

        pool.refill()  # a new one for the next job
        [ready_name] = pool.names()
        ray.get(ray.get_actor(ready_name, namespace=NAMESPACE).ready.remote(), timeout=120)
        taken.append(pool.take())
        assert taken[1][0] == ready_name != name
    finally:
        pool.shutdown()
        for _, handle in filter(None, taken):  # taken ones belong to their jobs, not to the pool
            ray.kill(handle, no_restart=True)


def test_a_supervisor_actor_never_has_torch_or_the_training_stack_imported(ray_cluster):
    """A supervisor is torch-free (docs/scale.md): nothing it imports at start pulls in torch, so no
    two of its threads can ever import torch at once (a partly initialised torch.utils once failed
    every drain of the tracking test)."""
    from service.supervisor.actor import create_supervisor

    handle = create_supervisor("trainyard-test-imports")
    try:
        loaded = ray.get(handle.__ray_call__.remote(
            lambda self: sorted(m for m in ("torch", "workers.parallel.registry", "workers.checkpointing.saver")
                                if m in __import__("sys").modules)), timeout=120)
        assert loaded == []
    finally:
        ray.kill(handle, no_restart=True)
