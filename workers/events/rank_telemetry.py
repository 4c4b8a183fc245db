"""Rank telemetry: what a rank emits and `WorkerGroup.poll()` returns (its steps, durable
checkpoints, data-split switches, the run events it saw first, its progress in a phase), and
`RankEvent`, their union.
"""

from __future__ import annotations

from dataclasses import dataclass

from workers.events.run_event import Json, RunEvent
from workers.phases import Progress


@dataclass(frozen=True)
class RankStep:
    """One rank's record of one step (workers/telemetry.py StepRecord, as a dict)."""

    record: Json

    @property
    def rank(self) -> int:
        return int(self.record["rank"])

    @property
    def step(self) -> int:
        return int(self.record["step"])


@dataclass(frozen=True)
class RankCheckpoint:
    """A checkpoint of `step` became durable on this rank."""

    rank: int
    step: int
    duration_s: float | None


@dataclass(frozen=True)
class RankShares:
    """The rank switched to this data split (a live straggler rebalance) after `step`."""

    rank: int
    step: int
    shares: tuple[int, ...]


@dataclass(frozen=True)
class RankNotice:
    """A run event a rank saw first (the checkpoint store failing, then answering again)."""

    rank: int
    event: RunEvent


@dataclass(frozen=True)
class RankProgress:
    """A rank's progress in a phase other than a step (workers/training/progress.py throttles them)."""

    rank: int
    progress: Progress


RankEvent = RankStep | RankCheckpoint | RankShares | RankNotice | RankProgress
