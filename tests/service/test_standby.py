"""Standby supervisors on the session's real Ray: a job takes a ready one, else one still
starting (its start-up is under way, so it answers sooner than a new actor), else none."""

from __future__ import annotations

import ray

from service.ray_client import NAMESPACE
from service.supervisor.standby import StandbyPool


def test_take_prefers_ready_then_starting_standbys(ray_cluster):
    pool = StandbyPool("test-take", size=1)
    taken = []
    try:
        pool.refill()
        taken.append(pool.take())  # still starting: handed over anyway
        name, handle = taken[0]
        assert name.startswith("trainyard-standby-test-take-")
        assert pool.take() is None and pool.names() == set()  # nothing left to give, nothing doubled
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
