"""Which probes count for the admission latency: those that fitted the whole time the scheduler had to see them.

Capacity in a full fleet turns over every second, and the scheduler holds what frees up for a
reserved job (the big one, or any queued job that waited `reserve_after_s`). Free GPUs are also
spoken for by the jobs already admitted whose placement group is not created yet (STARTING or
RECOVERING): the scheduler takes those out of what Ray reports free (Scheduler._reserved_not_held),
since their groups will take it. A 1-GPU probe "fits" if, from its submit for `REACTION_S` (two
scheduler intervals), every sample left at least one GPU beyond both: the control plane had
capacity for it the whole time and no reason to make it wait.
"""

from __future__ import annotations

REACTION_S = 1.0
SAMPLE_S = 0.1  # how often the simulator samples the cluster's free GPUs


def held_at(reservations: list[tuple[float, float, float]], t: float) -> float:
    """GPUs held at wall time t for reserved jobs; `reservations` as FleetDatabase.reservations()."""
    return sum(gpus for since, until, gpus in reservations if since <= t < until)


def spoken_for(forming: list[tuple[str, int, float]], created: set[tuple[str, int]]) -> float:
    """GPUs of admitted jobs, as (job id, supervisor epoch, GPUs), whose group (job, epoch) is not
    created yet: the scheduler's own rule."""
    return sum(gpus for job_id, epoch, gpus in forming if (job_id, epoch) not in created)


def fitted(free: list[tuple[float, float]], at: float, reservations: list[tuple[float, float, float]]) -> bool:
    """free: (wall time, free GPUs less those spoken for) samples. True if every sample in
    [at, at + REACTION_S] left a GPU beyond the reservation of its moment."""
    seen = [(t, gpus) for t, gpus in free if at <= t <= at + REACTION_S]
    return bool(seen) and all(gpus - held_at(reservations, t) >= 1 for t, gpus in seen)
