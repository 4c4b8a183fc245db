"""Whether windows of k consecutive components at even offsets cover a layer and connect its workers
(masks.py builds them); pure arithmetic, so checking a spec needs no torch."""

from __future__ import annotations

import math


def held_count(n: int, coverage: float) -> int:
    """Components per worker per layer: round(C x n), half up."""
    return int(math.floor(coverage * n + 0.5))


def offsets(n: int, workers: int) -> list[int]:
    return [w * n // workers for w in range(workers)]


def _gaps(n: int, workers: int) -> list[int]:
    o = offsets(n, workers)
    return [(o[(w + 1) % workers] - o[w]) % n or (n if workers == 1 else 0) for w in range(workers)]


def window_problem(n: int, workers: int, k: int) -> str | None:
    """Why windows of k out of n at the even offsets are not covering and connected; None if they are.

    Windows of equal length sorted by start: two overlap only if all windows between them
    overlap their neighbours, so the ring of neighbouring pairs decides connectivity.
    """
    if k >= n:
        return None
    gaps = _gaps(n, workers)
    if max(gaps) > k:
        return "leaves some held by nobody"
    if sum(g >= k for g in gaps) > 1:
        return "splits the workers into groups that share none"
    return None


def feasibility_error(n: int, workers: int, coverage: float, what: str) -> str | None:
    """Why (n components, K workers, C) cannot give a covering, connected assignment; None if it can."""
    k = held_count(n, coverage)
    if k < 1:
        return f"each worker must hold at least one {what}: round(coverage x {n}) = {k}"
    problem = window_problem(n, workers, k)
    if problem is None:
        return None
    k_min = next(j for j in range(k, n + 1) if window_problem(n, workers, j) is None)
    return (f"each worker holds round(coverage x {n}) = {k} of {n} {what}s, which with {workers} workers "
            f"{problem}, and the lowest feasible coverage is {k_min}/{n} = {k_min / n:.4g}")
