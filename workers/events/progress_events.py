"""Run events of how far a run is besides its steps: a long phase other than training, and a validation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from workers.events.run_event import Json, RunEvent
from workers.phases import Progress


@dataclass(frozen=True)
class PhaseEvent(RunEvent):
    """A phase other than training that has gone on for a while (`elapsed_s`), and how far it is: only
    long phases become events, so a job whose phases are quick keeps the events it always had."""

    kind: ClassVar[str] = "phase"
    rank: int
    progress: Progress
    elapsed_s: float

    @property
    def message(self) -> str:
        return f"rank {self.rank}: {self.progress.describe()} ({self.elapsed_s:.0f}s in this phase)"

    def data(self) -> Json:
        p = self.progress
        return {"rank": self.rank, "phase": p.phase.name.lower(), "done": p.done, "total": p.total,
                "unit": p.phase.unit, "step": p.step, "what": p.what, "elapsed_s": round(self.elapsed_s, 3)}


@dataclass(frozen=True)
class ValidationEvent(RunEvent):
    """A validation (every `train.eval_every` steps, and the final one) and what it covered."""

    kind: ClassVar[str] = "validation"
    step: int
    loss: float
    samples: int  # over all data-parallel ranks
    batches: int  # forward batches per rank
    batch_size: int  # samples per forward batch on a rank (train.eval_micro_batch_size)
    split_samples: int | None  # the validation split's size (None: a stream, of unknown length)
    final: bool

    @property
    def message(self) -> str:
        of = f" of {self.split_samples:,}" if self.split_samples is not None else ""
        return (f"{'final validation' if self.final else 'validation'} at step {self.step}: loss {self.loss:.4f} "
                f"over {self.samples:,}{of} samples ({self.batches:,} batches of {self.batch_size} per rank)")

    def data(self) -> Json:
        return {"step": self.step, "loss": self.loss, "samples": self.samples, "batches": self.batches,
                "batch_size": self.batch_size, "split_samples": self.split_samples, "final": self.final}
