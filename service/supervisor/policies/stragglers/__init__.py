"""Straggler policies: what to do about a rank the detector flagged as slow.

`supervisor.straggler.policy` names one of the policies in this registry. Adding one takes
its own module here, one line below, its name in `StragglerSpec.policy` (workers/spec/job.py)
and its test (see tests/fixtures/extra_straggler_policy.py). Policy names stay here: a policy that
needs something of the ranks says so in RANK_TERMS, as typed terms (workers/training/control.py).
"""

from __future__ import annotations

from collections.abc import Callable

from service.supervisor.policies.stragglers import rebalance, replace, report
from service.supervisor.policies.stragglers.status import StragglerDecision, StragglerStatus
from workers.spec import JobSpec
from workers.training.control import UnevenShares

StragglerPolicy = Callable[[StragglerStatus], StragglerDecision]

STRAGGLER_POLICIES: dict[str, StragglerPolicy] = {
    "report": report.on_slow_rank,
    "rebalance": rebalance.on_slow_rank,
    "replace": replace.on_slow_rank,
}


# What a policy asks the ranks to accept at start: (the current spec, the split they train on) -> terms.
RANK_TERMS: dict[str, Callable[[JobSpec, list[int] | None], UnevenShares | None]] = {
    "rebalance": rebalance.rank_terms,
}


def rank_terms(current: JobSpec, shares: list[int] | None) -> UnevenShares | None:
    """The typed terms the ranks start under (None: the even split, fixed for the run)."""
    terms = RANK_TERMS.get(current.supervisor.straggler.policy)
    return terms(current, shares) if terms is not None else None


def straggler_policy(name: str) -> StragglerPolicy:
    """The policy a spec names (`off` never gets here: no detector runs)."""
    return STRAGGLER_POLICIES[name]
