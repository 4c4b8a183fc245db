"""The warm worker pool: jobs start on pre-imported processes, and nothing outlives its job."""

from __future__ import annotations

import os
import time

import pytest
import ray
from ray.util.placement_group import placement_group, remove_placement_group

from service.supervisor.run import JobRun
from tests.helpers import alive_actors, spec_of, wait_until
from workers.runtime.pool import cpus_idle, start_pool

pytestmark = pytest.mark.slow


@pytest.fixture
def pool(ray_cluster):
    # busy_fraction=inf: refill regardless of load, so that the refill itself is what is tested.
    pool = start_pool(2, refill_delay_s=1.0, busy_fraction=float("inf"))
    assert wait_until(lambda: ray.get(pool.stats.remote())["idle"] == 2)
    yield pool
    ray.get(pool.shutdown.remote())
    ray.kill(pool)
    assert wait_until(lambda: alive_actors() == [], 30)


def test_job_runs_on_warm_workers_and_pool_refills(pool, tmp_path):
    summary = JobRun(spec_of(**{"resources.workers": 2}), tmp_path / "j", "j").run()
    assert summary["state"] == "SUCCEEDED" and summary["warm_workers"] == 2
    # The job's two workers are gone; the pool made two fresh ones.
    assert wait_until(lambda: ray.get(pool.stats.remote())["idle"] == 2)
    assert len(alive_actors()) == 3  # the pool and its two idle workers


def test_pooled_worker_exits_when_its_placement_group_is_removed(pool, tmp_path):
    # What happens to a job's workers if its supervisor vanishes without tearing down.
    pg = placement_group([{"CPU": 1}])
    ray.get(pg.ready())
    node = ray.get_runtime_context().get_node_id()
    [name] = ray.get(pool.take.remote([node]))
    worker = ray.get_actor(name)
    pid = ray.get(worker.assign.remote(0, 1, str(tmp_path), "rank-0.log", pg))
    assert pid > 0
    remove_placement_group(pg)
    assert wait_until(lambda: name not in {a["Name"] for a in alive_actors()}, 20)


def test_refill_waits_for_idle_cpus():
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0]
    assert cpus_idle(busy_fraction=(load + 1) / cores)
    assert not cpus_idle(busy_fraction=max(load - 0.5, 0) / cores) or load < 0.5


def test_refill_goes_ahead_once_no_job_holds_cpus(ray_cluster):
    """However high the load average (busy_fraction=0: never low enough), the pool refills as soon
    as no job holds CPUs on the cluster, and not while one does."""
    pool = start_pool(1, refill_delay_s=0.5, busy_fraction=0.0)
    try:
        assert wait_until(lambda: ray.get(pool.stats.remote())["idle"] == 1, 120)  # the first fill
        job = placement_group([{"CPU": 1}])  # a job's reservation
        ray.get(job.ready())
        [name] = ray.get(pool.take.remote([ray.get_runtime_context().get_node_id()]))
        ray.kill(ray.get_actor(name))
        time.sleep(3)
        assert ray.get(pool.stats.remote()) == {"size": 1, "idle": 0, "starting": 0}  # not while it holds CPUs
        remove_placement_group(job)
        assert wait_until(lambda: ray.get(pool.stats.remote())["idle"] == 1, 120)
    finally:
        ray.get(pool.shutdown.remote())
        ray.kill(pool)


def test_refill_beside_a_running_job_starts_one_worker_at_a_time(ray_cluster):
    """While a job holds CPUs and the node's CPUs look idle, the pool refills, but one worker at a
    time: each imports torch (twice, with its pre-started Python) beside the job's ranks."""
    pool = start_pool(2, refill_delay_s=0.5, busy_fraction=float("inf"))
    job = placement_group([{"CPU": 1}])  # a job's reservation
    try:
        assert wait_until(lambda: ray.get(pool.stats.remote())["idle"] == 2, 120)  # the first fill
        ray.get(job.ready())
        node = ray.get_runtime_context().get_node_id()
        for name in ray.get(pool.take.remote([node, node])):
            ray.kill(ray.get_actor(name))
        seen = []
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and (not seen or seen[-1]["idle"] < 2):
            seen.append(ray.get(pool.stats.remote()))
            time.sleep(0.1)
        assert seen[-1]["idle"] == 2, seen[-1]
        assert max(s["starting"] for s in seen) == 1, seen
    finally:
        remove_placement_group(job)
        ray.get(pool.shutdown.remote())
        ray.kill(pool)
