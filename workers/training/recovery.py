"""What rollbacks changed for the rest of a job: skipped data windows and the learning-rate factor.

The ledger `recovery.json` in the job's storage is written by rank 0 when bad steps
(non-finite gradients or loss spikes) exceed `fault_tolerance.max_skipped_steps`,
just before every rank raises NonFiniteTraining and the supervisor rolls the job back.
Resumed groups read it, and every checkpoint records it in its progress, so the data
a step draws and its learning rate stay pure functions of (step, ledger).
"""

from __future__ import annotations

import json
import os
import statistics
from collections import deque
from dataclasses import asdict, dataclass, field

from workers.events import RestartCause
from workers.spec import LossSpikeSpec
from workers.storage import Storage

LEDGER = "recovery.json"


class NonFiniteTraining(RuntimeError):
    """Too many non-finite steps in a row: the supervisor rolls back to the last checkpoint."""

    restart_cause = RestartCause.NON_FINITE


@dataclass
class RecoveryState:
    data_skips: list[list[int]] = field(default_factory=list)  # batch windows [a, b) never drawn again
    lr_scale: float = 1.0  # product of lr_backoff over the rollbacks so far
    rollbacks: list[dict] = field(default_factory=list)  # one entry per rollback, newest last

    @classmethod
    def load(cls, job: Storage | str | os.PathLike) -> "RecoveryState | None":
        try:
            return cls(**json.loads(Storage.of(job).read_text(LEDGER)))
        except FileNotFoundError:
            return None

    def save(self, job: Storage | str | os.PathLike) -> None:
        Storage.of(job).write_text(LEDGER, json.dumps(asdict(self), indent=1))  # atomic: never half a file

    def progress(self) -> dict:
        """What a checkpoint records (beside the step)."""
        return {"data_skips": [list(w) for w in self.data_skips], "lr_scale": self.lr_scale}

    @classmethod
    def from_progress(cls, progress: dict) -> "RecoveryState":
        return cls(data_skips=[list(w) for w in progress.get("data_skips", [])],
                   lr_scale=float(progress.get("lr_scale", 1.0)))


class LossSpikeDetector:
    """A loss above factor x the median of the last `window` good losses is a spike."""

    def __init__(self, config: LossSpikeSpec | None):
        self.config = config
        self.history: deque[float] = deque(maxlen=config.window if config else 1)

    def is_spike(self, loss: float | None) -> bool:
        if self.config is None or loss is None or len(self.history) < self.config.window:
            return False
        return loss > self.config.factor * statistics.median(self.history)

    def observe(self, loss: float | None) -> None:
        """Feed the loss of a step whose update was taken."""
        if loss is not None and loss == loss and abs(loss) != float("inf"):
            self.history.append(loss)
