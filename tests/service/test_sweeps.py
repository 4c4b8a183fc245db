"""The leader's periodic sweeps decide on a listing of the cluster taken before (service/sweeps.py):
supervisors nobody needs are killed and the rest kept, a standby handed a job after the listing is
kept, and a leaked group's holder jobs are read in one statement."""

from __future__ import annotations

from bench.control_pass import FakeCluster, StatementCounter
from service.db import repository as repo
from service.db import tenants as tenant_repo
from service.leaked_groups import LeakedGroups
from service.lifecycle import JobState
from service.supervisor.actor import supervisor_name
from service.supervisor.standby import StandbyPool
from service.sweeps import ClusterListing, sweep_orphans
from tests.helpers import spec_of
from workers.runtime.group_owner import GroupOwner


def _job(s, tenant_id: str, *states: JobState, epoch: int = 1) -> str:
    job = repo.create_job(s, tenant_id, spec_of(), 0, "sha", None, max_open_jobs=None)
    for state in states:
        repo.transition(s, job, state, "test")
    job.supervisor_epoch, job.supervisor_name = epoch, supervisor_name(job.id, epoch)
    return job.id


def test_orphans_are_killed_and_a_standby_handed_a_job_after_the_listing_is_kept(sessions):
    cluster = FakeCluster()
    pool = StandbyPool("plane", 0, cluster)
    with sessions.begin() as s:
        tenant = tenant_repo.ensure_tenant(s, "t").id
        running = _job(s, tenant, JobState.STARTING, JobState.RUNNING, epoch=2)
        ended = _job(s, tenant, JobState.CANCELLED)
        queued = _job(s, tenant)
    kept = {supervisor_name(running, 2), "trainyard-standby-other-plane-1", supervisor_name("not-a-job", 1)}
    killed = {supervisor_name(running, 1), supervisor_name(ended, 1), f"{pool.prefix}stale"}
    handed = f"{pool.prefix}handed"  # in the pool when listed, then taken for a job
    for name in kept | killed | {handed}:
        cluster.create_supervisor(name)
    pool.ready.append((handed, cluster.supervisors[handed]))
    listing = list(cluster.supervisors)
    assert pool.take() == (handed, cluster.supervisors[handed])  # the scheduler admits `queued` on it
    with sessions.begin() as s:
        job = repo.get_job(s, queued)
        repo.transition(s, job, JobState.STARTING, "admitted")
        job.supervisor_name = handed
    late = cluster.create_supervisor(supervisor_name(ended, 2))  # started after the listing: not in it
    assert set(sweep_orphans(sessions, cluster, pool, listing)) == killed
    assert set(cluster.supervisors) == kept | {handed, supervisor_name(ended, 2)}
    assert late not in cluster.killed


def test_a_leaked_groups_holder_jobs_are_read_in_one_statement(sessions):
    with sessions.begin() as s:
        tenant = tenant_repo.ensure_tenant(s, "t").id
        alive = [_job(s, tenant, JobState.STARTING, JobState.RUNNING) for _ in range(20)]
        ended = [_job(s, tenant, JobState.FAILED) for _ in range(10)]
    groups = {f"pg{i}": {"name": GroupOwner(job_id, 1).group_name(0), "state": "CREATED"}
              for i, job_id in enumerate(alive + ended)}
    listing = ClusterListing(groups, frozenset(supervisor_name(job_id, 1) for job_id in alive))
    cluster = FakeCluster()
    removed: list[str] = []
    cluster.remove_placement_group = lambda group_id: removed.append(group_id) or True  # type: ignore[method-assign]
    sweeper = LeakedGroups(sessions, cluster, grace_s=0.0)
    counter = StatementCounter(sessions.engine)
    names = sweeper.sweep(listing)
    statements, _ = counter.take()
    assert {GroupOwner.of_group(name).job_id for name in names} == set(ended)
    assert len(removed) == len(ended)
    assert statements == 1, f"{statements} statements for {len(groups)} groups' holders"


def test_a_standby_taken_for_an_admission_not_committed_yet_is_kept_until_it_settles(sessions):
    """The scheduler takes a standby without the launch lock: until its admission commits (the job's row
    names it), the orphan sweep must count it as the pool's, and after `settle` the row does."""
    cluster = FakeCluster()
    pool = StandbyPool("plane", 0, cluster)
    with sessions.begin() as s:
        queued = _job(s, tenant_repo.ensure_tenant(s, "t").id)
    taken = f"{pool.prefix}taken"
    cluster.create_supervisor(taken)
    pool.ready.append((taken, cluster.supervisors[taken]))
    assert pool.take()[0] == taken  # the admission's transaction has not committed yet
    assert sweep_orphans(sessions, cluster, pool, [taken]) == []
    with sessions.begin() as s:  # it commits, then settles the standby
        job = repo.get_job(s, queued)
        repo.transition(s, job, JobState.STARTING, "admitted")
        job.supervisor_name = taken
    pool.settle(taken)
    assert sweep_orphans(sessions, cluster, pool, [taken]) == []
    assert taken in cluster.supervisors
    standby = f"{pool.prefix}lost"  # taken, never committed nor given back, then settled: nobody's
    cluster.create_supervisor(standby)
    pool.ready.append((standby, cluster.supervisors[standby]))
    pool.settle(pool.take()[0])
    assert sweep_orphans(sessions, cluster, pool, [standby]) == [standby]
