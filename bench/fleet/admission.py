"""Which probes count for the admission latency: those that fitted the whole time the scheduler had to see them.

Capacity in a full fleet turns over every second, and the scheduler holds what frees up for a
reserved job (the big one, or any queued job that waited `reserve_after_s`). A 1-GPU probe
"fits" if, from its submit for `REACTION_S` (two scheduler intervals), every sample of the free
GPUs left at least one beyond what the reservation of that moment held: the control plane had
capacity for it the whole time and no reason to make it wait.
"""

from __future__ import annotations

REACTION_S = 1.0
SAMPLE_S = 0.1  # how often the simulator samples the cluster's free GPUs


def held_at(reservations: list[tuple[float, float, float]], t: float) -> float:
    """GPUs held at wall time t for reserved jobs; `reservations` as FleetDatabase.reservations()."""
    return sum(gpus for since, until, gpus in reservations if since <= t < until)


def fitted(free: list[tuple[float, float]], at: float, reservations: list[tuple[float, float, float]]) -> bool:
    """free: (wall time, free GPUs) samples. True if every sample in [at, at + REACTION_S] left a GPU."""
    seen = [(t, gpus) for t, gpus in free if at <= t <= at + REACTION_S]
    return bool(seen) and all(gpus - held_at(reservations, t) >= 1 for t, gpus in seen)
