"""Waiting for worker slots after a failure: the sizing policy asked until it stops saying WAIT.

The wait lives here, beside the run loop, so that the policy (policies/sizing.py) stays a pure
function of one capacity status.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from service.supervisor.policies.sizing import CapacityStatus, SizingAction, SizingDecision, on_capacity
from workers.spec import JobSpec


def wait_for_capacity(spec: JobSpec, current: JobSpec, free_slots: Callable[[], int], cancelled: Callable[[], bool],
                      settle_s: float, timeout_s: float, poll_s: float) -> tuple[SizingDecision, int]:
    """The first decision other than WAIT, with the free slots it was made on (KEEP if cancelled)."""
    started = time.monotonic()
    while not cancelled():
        free = free_slots()
        decision = on_capacity(CapacityStatus(spec, current, free, time.monotonic() - started, settle_s, timeout_s))
        if decision.action != SizingAction.WAIT:
            return decision, free
        time.sleep(poll_s)
    return SizingDecision(SizingAction.KEEP), 0  # cancelled: the next attempt notices
