"""Placement groups that outlived their supervisor are removed (service/leaked_groups.py), against a
real Ray: Ray leaks a group whose creating actor is killed while it creates it (the scheduler test
below kills supervisors at such a moment; here the groups are made directly, one per case)."""

from __future__ import annotations

import ray
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

from service.db import repository as repo
from service.db import tenants as tenant_repo
from service.leaked_groups import LeakedGroups
from service.lifecycle import JobState
from service.ray_client import NAMESPACE
from service.ray_cluster import RayCluster
from service.settings import get_settings
from service.supervisor.actor import JobSupervisor, supervisor_name
from tests.helpers import spec_of
from workers.runtime.group_owner import GroupOwner


def _job(s, tenant, *states: JobState, epoch: int = 1) -> str:
    job = repo.create_job(s, tenant.id, spec_of(), 0, f"k{len(states)}{epoch}{states[-1] if states else ''}", None, 100)
    for state in states:
        repo.transition(s, job, state, "test")
    job.supervisor_epoch, job.supervisor_name = epoch, supervisor_name(job.id, epoch)
    return job.id


def _live_groups() -> set[str]:
    return {pg["name"] for pg in placement_group_table().values() if pg["state"] != "REMOVED"}


def test_groups_no_supervisor_can_use_are_removed_after_the_grace_and_the_rest_are_kept(ray_cluster, sessions):
    with sessions.begin() as s:
        tenant = tenant_repo.ensure_tenant(s, "t")
        running = _job(s, tenant, JobState.STARTING, JobState.RUNNING)  # its supervisor is alive
        orphaned = _job(s, tenant, JobState.STARTING)  # its supervisor is gone
        ended = _job(s, tenant, JobState.CANCELLED)
    supervisor = JobSupervisor.options(name=supervisor_name(running, 1), namespace=NAMESPACE,
                                       lifetime="detached").remote()
    ray.get(supervisor.ready.remote())
    names = {
        "kept: its supervisor holds it": GroupOwner(running, 1).group_name(0),
        "kept: a job the database does not know (trainyard run)": GroupOwner("not-a-job", 0).group_name(0),
        "leaked: an earlier supervisor's": GroupOwner(running, 0).group_name(2),
        "leaked: its supervisor is gone": GroupOwner(orphaned, 1).group_name(0),
        "leaked: the job ended": GroupOwner(ended, 1).group_name(1),
    }
    groups = [placement_group([{"CPU": 0.01}], name=name) for name in names.values()]
    try:
        ray.get([g.ready() for g in groups], timeout=30)
        now = [0.0]
        sweeper = LeakedGroups(sessions, RayCluster(get_settings()), grace_s=10.0, clock=lambda: now[0])
        assert sweeper.sweep() == [] and set(names.values()) <= _live_groups()  # first seen, in its grace
        now[0] = 10.0
        removed = sweeper.sweep()
        assert sorted(removed) == sorted(n for why, n in names.items() if why.startswith("leaked"))
        live = _live_groups()
        assert {n for why, n in names.items() if why.startswith("kept")} <= live and not set(removed) & live
        assert sweeper.sweep() == []  # nothing is removed twice
    finally:
        ray.kill(supervisor, no_restart=True)
        for g in groups:
            remove_placement_group(g)
