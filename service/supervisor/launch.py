"""Starting a job's supervisor: a standby one if the pool has it ready, else a new actor.

Two steps around the caller's database transaction: `reserve()` picks the actor
and its name (which the transaction stores in the job row), `launch()` hands it
the job after the commit. A crash in between leaves a row naming an idle or
missing supervisor, which the reconciler completes or replaces.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from service.cluster_port import Cluster
from service.db.repository import metric_stride
from service.settings import Settings
from service.supervisor.actor import supervisor_name
from service.supervisor.policies.failure import RestartsUsed
from service.supervisor.standby import StandbyPool
from workers.storage import client_env


@dataclass
class Reservation:
    name: str | None = None
    handle: Any = None  # set when a standby was taken


class Launcher:
    def __init__(self, settings: Settings, pool: StandbyPool | None = None, cluster: Cluster | None = None,
                 placement: Callable[[], str | None] = lambda: None):
        if cluster is None:
            from service.ray_cluster import RayCluster

            cluster = RayCluster(settings)
        self.settings, self.pool, self.cluster = settings, pool, cluster
        # Why no supervisor can be placed now (service/supervisor/placement.py; the control plane's
        # last look at the nodes), None when one can: a job launched meanwhile is told why it waits.
        self.placement = placement

    def reserve(self) -> Reservation:
        taken = self.pool.take() if self.pool is not None else None
        return Reservation(*taken) if taken else Reservation()

    def name(self, reservation: Reservation, job_id: str, epoch: int) -> str:
        if reservation.name is None:
            reservation.name = supervisor_name(job_id, epoch)
        return reservation.name

    def release(self, reservation: Reservation) -> None:
        """The job was not admitted after all: a standby goes back to the pool."""
        if reservation.handle is not None and self.pool is not None:
            assert reservation.name is not None, "a standby is taken with its name"
            self.pool.give_back((reservation.name, reservation.handle))

    def launch(self, reservation: Reservation, job_id: str, spec: dict, epoch: int, total_steps: int,
               used: RestartsUsed) -> Any:
        assert reservation.name is not None, "name() named the supervisor in the transaction that admitted the job"
        if self.pool is not None:
            self.pool.settle(reservation.name)  # committed: the job's row names the standby from now on
        handle = reservation.handle or self.cluster.create_supervisor(reservation.name)
        handle.start.remote(job_id, spec, self.settings.job_storage(job_id).uri, epoch,
                            metric_stride(total_steps, self.settings.metrics_max_points), client_env(), used)
        return handle
