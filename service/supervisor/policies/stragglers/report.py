"""The `report` straggler policy: an event and a metric, nothing moved."""

from __future__ import annotations

from service.supervisor.policies.stragglers.status import StragglerDecision, StragglerStatus, reported


def on_slow_rank(status: StragglerStatus) -> StragglerDecision:
    return reported()
