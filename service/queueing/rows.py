"""What the queueing policy reads: a queued job, a tenant's standing, an amount of CPUs and GPUs."""

from __future__ import annotations

from dataclasses import dataclass

EPS = 1e-6


@dataclass(frozen=True)
class Resources:
    """An amount of CPUs and GPUs (free now, held by a tenant, or the cluster's total)."""

    cpus: float = 0.0
    gpus: float = 0.0

    def covers(self, cpus: float, gpus: float) -> bool:
        return cpus <= self.cpus + EPS and gpus <= self.gpus + EPS

    def minus(self, cpus: float, gpus: float) -> Resources:
        """What is left after taking `cpus` and `gpus`, never below zero."""
        return Resources(max(0.0, self.cpus - cpus), max(0.0, self.gpus - gpus))

    @property
    def empty(self) -> bool:
        # Every job asks more than 0 CPUs per worker (workers/spec), so no CPU left means nothing fits.
        return self.cpus <= EPS


@dataclass(frozen=True)
class QueuedJob:
    """A QUEUED job as the scheduler sees it: the few columns it orders and fits by, never the spec."""

    id: str
    tenant_id: str
    priority: int
    created_at: float  # seconds since the epoch; orders a tenant's jobs (a requeued job keeps its place)
    queued_at: float  # when it last entered QUEUED: how long it has waited, for its reservation
    workers: int
    cpus: float
    gpus: float = 0.0

    @property
    def order(self) -> tuple[int, float, str]:
        """Its place in its tenant's queue: highest priority first, then oldest first."""
        return (-self.priority, self.created_at, self.id)


@dataclass(frozen=True)
class QueueBounds:
    """Lower bounds over a tenant's queued jobs: when the longest waiting one entered QUEUED, and the
    fewest CPUs and GPUs any one asks. A pass skips a tenant none of whose jobs can start or starve."""

    oldest_queued_at: float
    min_cpus: float
    min_gpus: float


@dataclass(frozen=True)
class TenantState:
    """A tenant's standing this tick: its weight and quota, and what its admitted jobs hold now."""

    id: str
    weight: float = 1.0  # > 0; twice the weight, twice the share before it yields to others
    max_workers: int | None = None  # None: no quota of its own
    reserve_after_s: float | None = None  # None: the server's TRAINYARD_RESERVE_AFTER_S
    held_cpus: float = 0.0
    held_gpus: float = 0.0
    held_workers: int = 0

    def share(self, total: Resources) -> float:
        """Dominant resource share (DRF) over weight: the larger of the cluster's CPUs and GPUs it
        holds, divided by its weight. On a GPU cluster GPUs dominate; a CPU-only tenant is measured
        by its CPUs, so neither kind of job gets a free ride."""
        cpu = self.held_cpus / total.cpus if total.cpus > EPS else 0.0
        gpu = self.held_gpus / total.gpus if total.gpus > EPS else 0.0
        return max(cpu, gpu) / self.weight
