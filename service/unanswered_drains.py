"""Drains a reconcile pass sent that were not back by its deadline, kept for the next pass.

A pass waits for its supervisors under one short deadline (service/reconciler.py), so one slow
supervisor (a loaded node, a 4,096-rank job's join) never holds the pass. Its drain is not sent
again: the reference stays in flight and the next pass gathers it beside the new ones, so a
supervisor that always needs longer than one deadline still gets drained, over several passes, and
never has two drains of the same ack outstanding. A reference is dropped once it answers (or ends
otherwise), when the job's supervisor changes, or when the job is no longer active.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from service.cluster_port import Reply, ReplyKind

log = logging.getLogger("trainyard.reconciler")
WARN_AFTER_S = 10.0  # a drain out this long is logged once: its supervisor is slow, not just late


@dataclass
class _InFlight:
    ref: Any
    handle: Any
    since: float
    warned: bool = False


class UnansweredDrains:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._out: dict[str, _InFlight] = {}
        self._clock = clock

    def __len__(self) -> int:
        return len(self._out)

    def ref(self, job_id: str, handle: Any) -> Any | None:
        """The job's drain still in flight to this same supervisor, if any (else send a new one)."""
        out = self._out.get(job_id)
        if out is None:
            return None
        if out.handle is not handle:  # a new supervisor: the old one's answer no longer counts
            del self._out[job_id]
            return None
        return out.ref

    def update(self, replies: dict[str, Reply], refs: dict[str, Any], handles: dict[str, Any]) -> None:
        """After a pass's gather: keep what did not answer, forget the rest and the jobs not asked."""
        now = self._clock()
        for job_id in list(self._out):
            if job_id not in refs:  # ended, requeued or lost: not asked this pass
                del self._out[job_id]
        for job_id, reply in replies.items():
            if reply.kind != ReplyKind.NO_ANSWER:
                self._out.pop(job_id, None)
                continue
            out = self._out.get(job_id)
            if out is None or out.ref is not refs[job_id]:
                out = self._out[job_id] = _InFlight(refs[job_id], handles[job_id], now)
            if not out.warned and now - out.since >= WARN_AFTER_S:
                out.warned = True
                log.warning("supervisor of %s has not answered its drain for %.0fs", job_id, now - out.since)
