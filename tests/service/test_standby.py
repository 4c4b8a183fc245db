"""Standby supervisors on the session's real Ray: a job takes a ready one, else one still
starting (its start-up is under way, so it answers sooner than a new actor), else none."""

from __future__ import annotations

import ray

from service.supervisor.standby import StandbyPool
from tests.helpers import wait_until


def test_take_prefers_ready_then_starting_standbys(ray_cluster):
    pool = StandbyPool("test-take", size=1)
    try:
        pool.refill()
        name, handle = pool.take()  # still starting: handed over anyway
        assert name.startswith("trainyard-standby-test-take-")
        assert pool.take() is None and pool.names() == set()  # nothing left to give, nothing doubled
        assert ray.get(handle.ready.remote(), timeout=120)  # the taken one finishes starting for its job

        pool.refill()  # a new one for the next job
        assert wait_until(lambda: (pool._harvest(), pool.ready)[1], 120)
        ready_name, _ = pool.ready[0]
        assert pool.take()[0] == ready_name and ready_name != name
    finally:
        pool.shutdown()
        ray.kill(handle, no_restart=True)
