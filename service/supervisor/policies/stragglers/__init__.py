"""Straggler policies: what to do about a rank the detector flagged as slow.

`supervisor.straggler.policy` names one of the policies in this registry. Adding one takes
its own module here, one line below, its name in `StragglerSpec.policy` (workers/spec/job.py)
and its test (see tests/fixtures/extra_straggler_policy.py).
"""

from __future__ import annotations

from collections.abc import Callable

from service.supervisor.policies.stragglers import rebalance, replace, report
from service.supervisor.policies.stragglers.status import StragglerDecision, StragglerStatus

StragglerPolicy = Callable[[StragglerStatus], StragglerDecision]

STRAGGLER_POLICIES: dict[str, StragglerPolicy] = {
    "report": report.on_slow_rank,
    "rebalance": rebalance.on_slow_rank,
    "replace": replace.on_slow_rank,
}


def straggler_policy(name: str) -> StragglerPolicy:
    """The policy a spec names (`off` never gets here: no detector runs)."""
    return STRAGGLER_POLICIES[name]
