"""The causes and decisions that become metric labels: why a worker group was restarted
(`RestartCause`) and what a straggler policy did about a slow rank (`StragglerAction`). Metric
labels are read from these fields of the run events, never from their text.
"""

from __future__ import annotations

from enum import StrEnum


class RestartCause(StrEnum):
    """Why a worker group was restarted (the `cause` label of trainyard_restarts_total)."""

    WORKER_LOST = "worker_lost"  # a rank's process died or stopped answering; its node lives on
    NODE_LOST = "node_lost"  # the Ray node a rank ran on died (the cluster's fault, not the job's)
    HANG = "hang"
    START = "start"
    NON_FINITE = "non_finite"  # non-finite gradients or loss spikes: a rollback
    CORRUPTION = "corruption"  # replicas disagree: restore the last checkpoint
    ERROR = "error"
    SUPERVISOR_LOST = "supervisor_lost"  # the control plane replaced a lost supervisor
    STORAGE = "storage"  # the checkpoint store stayed unreachable past its retry limit
    OUT_OF_MEMORY = "out_of_memory"  # a rank ran out of memory: a restart would too (never restarted)

    @property
    def rolls_back(self) -> bool:
        return self in (RestartCause.NON_FINITE, RestartCause.CORRUPTION)

    @property
    def infrastructure(self) -> bool:
        """The cluster failed the job, not the job itself: charged to `max_infra_restarts`."""
        return self in (RestartCause.NODE_LOST, RestartCause.SUPERVISOR_LOST)


class StragglerAction(StrEnum):
    """What a straggler policy did about a slow rank (the `action` label)."""

    REPORTED = "reported"
    REBALANCE_PLANNED = "rebalance_planned"
    REPLACE_PLANNED = "replace_planned"
