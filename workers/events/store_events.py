"""Run events of the outside stores a run writes to failing, which training outlives: a write to the
job's store retried and then through, and a tracking sink (mlflow, tensorboard) giving up on records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from workers.events.run_event import Json, RunEvent

SUPERVISOR = -1  # the `rank` of a retry made by the job's supervisor, not by a rank


@dataclass(frozen=True)
class StoreRetryEvent(RunEvent):
    """A write to the job's store failed; the rank retries after `delay_s` (bounded backoff)."""

    kind: ClassVar[str] = "store_retry"
    rank: int  # SUPERVISOR (-1) for the supervisor's own reads
    what: str  # e.g. "checkpoint step 40"
    attempt: int
    delay_s: float
    error: str
    ranks: int = 1  # ranks that reported it at once (merged by the supervisor: one event, not one per rank)

    @property
    def message(self) -> str:
        return (f"{_ranks(self.rank, self.ranks)}: {self.what} failed ({self.error}); retry {self.attempt} "
                f"in {self.delay_s:.1f}s")

    def data(self) -> Json:
        return {"rank": self.rank, "what": self.what, "attempt": self.attempt, "delay_s": self.delay_s,
                "error": self.error, "ranks": self.ranks}


@dataclass(frozen=True)
class StoreRecoveredEvent(RunEvent):
    """The store answered again: the write that was retried went through."""

    kind: ClassVar[str] = "store_recovered"
    rank: int
    what: str
    retries: int
    after_s: float
    ranks: int = 1  # ranks that reported it at once (merged by the supervisor)

    @property
    def message(self) -> str:
        return (f"{_ranks(self.rank, self.ranks)}: {self.what} written after {self.retries} retries "
                f"({self.after_s:.1f}s)")

    def data(self) -> Json:
        return {"rank": self.rank, "what": self.what, "retries": self.retries, "after_s": self.after_s,
                "ranks": self.ranks}


def _ranks(rank: int, ranks: int) -> str:
    if rank < 0:  # SUPERVISOR: the job's supervisor reads the store too (its resume point)
        return "the supervisor"
    return f"rank {rank}" if ranks == 1 else f"rank {rank} and {ranks - 1} other ranks"


@dataclass(frozen=True)
class TrackingDroppedEvent(RunEvent):
    """A tracking sink (mlflow, tensorboard) gave up on some records: training went on without them."""

    kind: ClassVar[str] = "tracking_dropped"
    sink: str
    dropped: int  # records given up since the previous such event of this sink
    steps: tuple[int, int] | None  # the first and last step among them, if any were step records
    error: str  # the last error the sink saw

    @property
    def message(self) -> str:
        where = f" (steps {self.steps[0]}..{self.steps[1]})" if self.steps else ""
        return f"{self.sink} logging dropped {self.dropped} record(s){where} after retries: {self.error}"

    def data(self) -> Json:
        return {"sink": self.sink, "dropped": self.dropped, "steps": list(self.steps) if self.steps else None,
                "error": self.error}
