"""The second half of a scheduler tick: starting the supervisors of the jobs it admitted.

A tick first commits every admission (each job claimed with SKIP LOCKED and moved to STARTING in a
transaction of its own), then starts their supervisors here, one call to the cluster each. So a
job's admission never waits for the supervisor starts of the jobs admitted before it in the same
tick (at a fleet's size a start is a round trip to Ray's GCS). No lock is held here (a 4,096-rank
job's start once held every reconcile pass behind it): each admitted job was marked `launching` in the
shared handles before its admission committed, and the reconciler leaves a marked job alone, so it
never takes a committed job without its handle for a lost one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from service.db import repository as repo
from service.db.engine import SessionSource
from service.supervisor.launch import Launcher, Reservation
from service.supervisor.policies.failure import RestartsUsed
from service.supervisor_handles import Handles

log = logging.getLogger("trainyard.scheduler")


@dataclass(frozen=True)
class Launch:
    """A job committed STARTING whose supervisor is not started yet."""

    job_id: str
    reservation: Reservation
    spec: dict
    epoch: int
    total_steps: int
    used: RestartsUsed


def launch_all(launcher: Launcher, sessions: SessionSource, handles: Handles, launches: list[Launch]) -> None:
    """Start the supervisors of jobs already committed STARTING; their handles go into `handles`.
    If this process dies first, the reconciler starts them; a replica that lost the lease since
    leaves them to the new leader (never two supervisors). A start that fails is retried by the
    reconciler."""
    started = []
    for n, launch in enumerate(launches):
        if not getattr(sessions, "still_leading", lambda: True)():
            for left in launches[n:]:
                handles.launched(left.job_id, None)
            return
        handle: Any = None
        try:
            handle = launcher.launch(launch.reservation, launch.job_id, launch.spec, launch.epoch,
                                     launch.total_steps, launch.used)
        except Exception as exc:
            log.warning("starting the supervisor of %s failed: %s", launch.job_id, exc)
        finally:
            handles.launched(launch.job_id, handle)
        started.append(launch.job_id)
    if started and (why := launcher.placement()):  # Ray holds them until a node can take one
        with sessions.begin() as s:
            for job_id in started:
                repo.add_event(s, job_id, "supervisor_waiting", f"waiting for a supervisor: {why}")
