"""Placement groups that outlived their supervisor, removed so their CPUs and GPUs come back.

Ray removes a group when the supervisor actor that created it dies, except when the actor is
killed while the group is being created: then the group stays CREATED, holding its resources,
for good (workers/runtime/group_owner.py). A group named for a job of this service is leaked
when no supervisor can still use it: the job is no longer active, a later supervisor epoch
took over, or the supervisor of its epoch is gone. It is removed once it has been seen leaked
for `grace_s` (a supervisor tearing its group down as the job ends removes it itself). The
leader sweeps with its orphaned supervisors (service/sweeps.py, every 20 reconciler passes); a
supervisor is alive if the listing of named actors taken after the groups' names it.
Groups of jobs the database does not know (`trainyard run` on the same cluster) are never touched.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

from service.cluster_port import Cluster
from service.db.engine import SessionSource
from service.lifecycle import JobState
from service.sweeps import ClusterListing, JobHolder, list_cluster, read_holders
from workers.runtime.group_owner import GroupOwner

log = logging.getLogger("trainyard.leaked_groups")
HOLDING = (JobState.STARTING, JobState.RUNNING, JobState.RECOVERING)  # states a supervisor holds a group in


def is_leaked(owner: GroupOwner, job: JobHolder, supervisor_alive: Callable[[str | None], bool]) -> bool:
    return (job.state not in HOLDING or owner.epoch != job.epoch
            or not supervisor_alive(job.supervisor_name))


class LeakedGroups:
    def __init__(self, sessions: SessionSource, cluster: Cluster, grace_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic):
        self.sessions, self.grace_s, self.clock, self.cluster = sessions, grace_s, clock, cluster
        self.first_seen: dict[tuple[str, str], float] = {}  # (name, id) -> when first seen leaked

    def sweep(self, listing: ClusterListing | None = None, lock: AbstractContextManager = nullcontext()) -> list[str]:
        """Remove the groups leaked for at least `grace_s`; their names. `listing`: the cluster listed
        before (else listed here, outside `lock`); `lock`: the launch lock, held while deciding
        (service/sweeps.py says why that order is safe)."""
        listing = listing or list_cluster(self.cluster)
        named = {(pg["name"], pg_id): owner for pg_id, pg in listing.groups.items()
                 if pg.get("state") != "REMOVED" and (owner := GroupOwner.of_group(pg.get("name") or ""))}
        if not named:
            self.first_seen.clear()
            return []
        with lock:
            with self.sessions() as s:  # every holder in one statement, not one job at a time
                holders = read_holders(s, {o.job_id for o in named.values()})
        alive = listing.actors.__contains__
        leaked = {key for key, owner in named.items()
                  if owner.job_id in holders and is_leaked(owner, holders[owner.job_id], alive)}
        now = self.clock()
        self.first_seen = {key: self.first_seen.get(key, now) for key in leaked}
        removed = []
        for (name, pg_id), since in self.first_seen.items():
            if now - since >= self.grace_s and self.cluster.remove_placement_group(pg_id):
                log.warning("removed placement group %s: its supervisor is gone (a group Ray leaked)", name)
                removed.append(name)
        return removed
