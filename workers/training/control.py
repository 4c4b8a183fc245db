"""What the supervisor asks of a running rank, and how the ranks agree on it.

Requests arrive on the actor's RPC threads at any time; the training loop acts on them only at
agreement steps that every rank knows in advance (checkpoint steps, and every `UnevenShares.every`
steps when the supervisor may re-split the data), after one small all-reduce, so that all ranks act at
the same step. A rank acting alone would hang its peers' next collective (stop) or break the global
batch (shares). The ranks get typed terms, never the straggler policy's name: that stays in the supervisor.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from workers.spec import JobSpec

if TYPE_CHECKING:
    from workers.parallel.control_group import ControlGroups


@dataclass(frozen=True)
class UnevenShares:
    """The supervisor may give the data-parallel ranks uneven shares of the global batch while they run
    (granted only where the data-parallel step can take them: `step_capabilities`). The ranks agree on a
    requested split every `every` steps, and start from `start` (samples per dp rank; None: even)."""

    every: int
    start: tuple[int, ...] | None = None


class RankControl:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._shares: tuple[int, list[int]] | None = None  # (version, samples per dp rank)
        self.applied_version = 0

    def request_stop(self) -> None:
        self._stop.set()

    @property
    def stop_event(self) -> threading.Event:
        """Set once the supervisor asked this rank to stop (a program's should_stop() reads it)."""
        return self._stop

    def request_shares(self, version: int, shares: list[int]) -> None:
        with self._lock:
            self._shares = (version, list(shares))

    def pending_shares(self) -> tuple[int, list[int]] | None:
        """The latest shares request (version, shares), if any: passed on to a loop in another process."""
        with self._lock:
            return None if self._shares is None else (self._shares[0], list(self._shares[1]))

    def agree(self, groups: ControlGroups, may_stop: bool) -> tuple[bool, list[int] | None]:
        """(stop, new shares) that every rank agrees on at this step; a collective on every rank.

        Stop: any rank was asked, and this is a checkpoint step (`may_stop`, the same on every rank).
        Shares: every rank holds the same request version, newer than the one applied.
        """
        import torch  # here, not at import: the control plane imports this module with the actor
        import torch.distributed as dist

        with self._lock:
            version, shares = self._shares or (0, None)
        # One MAX all-reduce gives any-stop, the lowest version (negated) and the highest.
        # A control collective: host values on the CPU group (workers/parallel/control_group.py).
        flags = torch.tensor([int(self._stop.is_set()), -version, version], dtype=torch.int64)
        groups.all_reduce(flags, op=dist.ReduceOp.MAX)
        stop, lowest, highest = bool(flags[0].item()), -int(flags[1].item()), int(flags[2].item())
        if lowest == highest > self.applied_version:
            self.applied_version = version
            return stop and may_stop, shares
        return stop and may_stop, None


def agreement_due(spec: JobSpec, step: int, checkpointed: bool, uneven: UnevenShares | None) -> bool:
    """Whether the ranks agree on requests after `step` (known alike on every rank)."""
    if step >= spec.train.steps:
        return False
    return checkpointed or (uneven is not None and step % uneven.every == 0)
