"""The leader's periodic sweeps (every 20 reconciler passes): supervisors nobody needs are killed,
placement groups Ray leaked are removed (service/leaked_groups.py).

The cluster is listed outside the launch lock, the decision is taken under it. Every scheduler tick
takes that lock, and at a fleet's size listing every named actor and placement group takes seconds:
under the lock, admission waited for it. The order keeps the sweeps safe without the lock around the
listing: the cluster is listed first and the database read after, under the lock, so a supervisor
started after the listing is not in it, and one the scheduler handed a job after the listing shows
in the jobs read as in use. A verdict never goes stale: standby names are never reused and a job's
supervisor name only moves to later epochs, so the kills may run after the lock is let go.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import select

from service.cluster_port import Cluster
from service.db.engine import SessionSource
from service.db.models import Job
from service.db.repository import ACTIVE
from service.lifecycle import TERMINAL, JobState

if TYPE_CHECKING:
    from service.supervisor.standby import StandbyPool

log = logging.getLogger("trainyard.control")
IDS_PER_STATEMENT = 500  # job ids in one IN list (SQLite's limit on bound parameters, with room)


@dataclass(frozen=True)
class JobHolder:
    """What the database says about a job a supervisor or a placement group is named for."""

    state: JobState
    epoch: int
    supervisor_name: str | None


@dataclass(frozen=True)
class ClusterListing:
    groups: dict[str, dict]  # placement group id -> Ray's table entry
    actors: frozenset[str]  # the service's named actors, listed after the groups


def list_cluster(cluster: Cluster) -> ClusterListing:
    """The groups, then the actors: a group listed was created by a supervisor that existed then,
    so one still alive is in the actors' listing."""
    groups = cluster.placement_groups()
    return ClusterListing(groups, frozenset(cluster.named_actors()))


def read_holders(s, job_ids: Iterable[str]) -> dict[str, JobHolder]:
    """The jobs' state, epoch and supervisor name, one statement per IDS_PER_STATEMENT jobs."""
    ids = sorted(set(job_ids))
    out = {}
    for i in range(0, len(ids), IDS_PER_STATEMENT):
        q = select(Job.id, Job.state, Job.supervisor_epoch, Job.supervisor_name).where(
            Job.id.in_(ids[i:i + IDS_PER_STATEMENT]))
        out.update({job_id: JobHolder(JobState(state), epoch, name) for job_id, state, epoch, name in s.execute(q)})
    return out


def orphans(sessions: SessionSource, pool: StandbyPool, actors: Iterable[str]) -> list[str]:
    """The listed actors nobody needs: supervisors of ended jobs or of an epoch the job has left,
    and this plane's standbys the pool no longer knows. Other planes' actors are left alone."""
    from service.supervisor.actor import SUPERVISOR_PREFIX

    pooled = pool.names()  # before the jobs: a standby settled since is in their read (StandbyPool.lent)
    with sessions() as s:
        in_use = set(s.scalars(select(Job.supervisor_name).where(Job.state.in_(ACTIVE)))) | pooled
        candidates = [name for name in actors if name not in in_use]
        job_of = {name: name.removeprefix(SUPERVISOR_PREFIX).rsplit("-", 1)[0] for name in candidates
                  if not pool.owns(name) and name.startswith(SUPERVISOR_PREFIX)}
        holders = read_holders(s, job_of.values())
    stale = []
    for name in candidates:
        if pool.owns(name):
            stale.append(name)
        elif (job := holders.get(job_of.get(name, ""))) is not None:
            if job.state in TERMINAL or job.supervisor_name != name:
                stale.append(name)
    return stale


def sweep_orphans(sessions: SessionSource, cluster: Cluster, pool: StandbyPool, actors: Iterable[str] | None = None,
                  lock: AbstractContextManager = nullcontext()) -> list[str]:
    """Kill the supervisors nobody needs; their names. `actors`: a listing taken before (else listed
    here, outside `lock`); `lock`: the launch lock, held while deciding."""
    listed = list(cluster.named_actors() if actors is None else actors)
    with lock:
        stale = orphans(sessions, pool, listed)
    killed = []
    for name in stale:
        if (handle := cluster.find_supervisor(name)) is not None:
            cluster.kill(handle)
            killed.append(name)
    return killed
