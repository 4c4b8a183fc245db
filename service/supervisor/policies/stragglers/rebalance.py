"""The `rebalance` straggler policy: split the global batch by measured speed, live.

The running ranks switch together at their next agreement step, without a restart
(workers/training/control.py). The per-sample compute times are medians over the window that
flagged the rank: mostly the slow regime. The ranks never see this policy's name: they get typed
terms (`UnevenShares`), granted only where the data-parallel step declares it can take uneven shares.
"""

from __future__ import annotations

from service.supervisor.policies.stragglers.status import StragglerDecision, StragglerStatus, reported
from workers.events import StragglerAction
from workers.parallel.layouts import step_capabilities
from workers.spec import JobSpec
from workers.training.control import UnevenShares


def even_shares(global_batch: int, dp: int) -> list[int]:
    """The split every data-parallel job starts with (the spec makes dp divide the global batch)."""
    return [global_batch // dp] * dp


def rebalanced_shares(global_batch: int, per_sample_times: list[float]) -> list[int]:
    """Split the global batch in proportion to each rank's speed (every rank keeps >= 1 sample)."""
    speeds = [1.0 / t for t in per_sample_times]
    total = sum(speeds)
    exact = [global_batch * s / total for s in speeds]
    shares = [max(1, int(x)) for x in exact]
    # Hand out what rounding left to the ranks that lost the most (one sort: linear in ranks, not n^2).
    short = global_batch - sum(shares)
    if short > 0:
        order = sorted(range(len(shares)), key=lambda r: exact[r] - shares[r], reverse=True)
        for i in range(short):
            shares[order[i % len(order)]] += 1
    elif short < 0:  # the floor of 1 sample gave too much: take it back from the most over-served
        order = sorted(range(len(shares)), key=lambda k: shares[k] - exact[k], reverse=True)
        i = 0
        while short < 0:
            r = order[i % len(order)]
            if shares[r] > 1:
                shares[r] -= 1
                short += 1
            i += 1
    return shares


def rank_terms(current: JobSpec, shares: list[int] | None) -> UnevenShares | None:
    """What the ranks are told at start: agree on a new split every straggler window, from `shares`. None
    where the step cannot take uneven shares (submit refuses those specs; this keeps a resize honest)."""
    if not step_capabilities(current).uneven_shares:
        return None
    return UnevenShares(current.supervisor.straggler.window, tuple(shares) if shares else None)


def on_slow_rank(status: StragglerStatus) -> StragglerDecision:
    if not status.uneven_shares:  # the data-parallel step's capability, not a list of layouts
        return reported("the data-parallel step cannot take uneven shares")
    if status.dp < 2:
        return reported("no data-parallel peers to take work")
    if status.shares_pending is not None:
        return reported(f"the split {list(status.shares_pending)} is about to apply")
    shares = rebalanced_shares(status.global_batch, list(status.per_sample_s))
    current = list(status.current_shares)
    if shares == current:
        return reported(f"the split {current} already follows the measured speed")
    return StragglerDecision(StragglerAction.REBALANCE_PLANNED, f"rebalancing the global batch from {current} to "
                                                                f"{shares} at the next agreement step",
                             shares=tuple(shares))
