"""The phases a rank can spend long in outside its steps, and its progress in one: each phase
reports progress in its own unit, so the supervisor tells a slow phase from a hung one and the
job's view (GET /v1/jobs/{id} `phase`) says what the job is doing."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Phase(StrEnum):
    """What a rank is doing between (or before, or after) its steps: each phase it can spend long in
    reports progress in its own unit, so the supervisor tells a slow phase from a hung one."""

    OPENING_DATA = "opening data"  # building the datasets (file indexes, tokenising); stages done
    BUILDING_MODEL = "building the model"  # building, sharding or wrapping it, the optimiser; stages done
    LOADING_CHECKPOINT = "loading checkpoint"  # resuming from the latest checkpoint
    FIRST_STEP = "first step"  # its set-up: warm-up, allocation (compilation once that lands); micro-batches
    TRAINING = "training"  # steps (RankStep is the progress)
    EVALUATING = "evaluating"  # validation batches of this rank
    SAVING_CHECKPOINT = "saving checkpoint"  # bytes staged on the node's disk
    UPLOADING_CHECKPOINT = "uploading checkpoint"  # bytes written to the job's storage
    EXPORTING = "exporting"  # the final model: gathering it, hashing, writing it out; stages done

    @property
    def unit(self) -> str:
        return {Phase.EVALUATING: "batches", Phase.SAVING_CHECKPOINT: "bytes", Phase.UPLOADING_CHECKPOINT: "bytes",
                Phase.FIRST_STEP: "micro-batches", Phase.TRAINING: "steps"}.get(self, "stages")


@dataclass(frozen=True)
class Progress:
    """How far one rank is in one phase: `done` of `total` (None: not known ahead) in the phase's unit.
    `step`: the optimizer steps finished when the phase began; `what` tells apart two phases of one kind
    at one step ("final validation", "checkpoint step 40")."""

    phase: Phase
    done: int = 0
    total: int | None = None
    step: int = 0
    what: str = ""

    @property
    def key(self) -> tuple[Phase, int, str]:
        """The phase this is progress in: a new key is progress, so is a larger `done` under the same key."""
        return (self.phase, self.step, self.what)

    def advanced_from(self, before: Progress | None) -> bool:
        return before is None or before.key != self.key or self.done > before.done

    def describe(self) -> str:
        """`evaluating 1,200/3,125 batches`, `uploading checkpoint 40% of 12.0 MB`."""
        name = f"{self.phase.value} ({self.what})" if self.what else self.phase.value
        if self.total is None or self.total <= 0:
            return name if not self.done else f"{name} {self.done:,} {self.phase.unit}"
        if self.phase.unit == "bytes":
            return f"{name} {100 * self.done // self.total}% of {self.total / 1e6:,.1f} MB"
        return f"{name} {self.done:,}/{self.total:,} {self.phase.unit}"

    def view(self) -> dict[str, Any]:
        """The phase as the job's view shows it (GET /v1/jobs/{id} `phase`): typed figures and the message."""
        return {"name": self.phase.name.lower(), "done": self.done, "total": self.total, "unit": self.phase.unit,
                "step": self.step, "what": self.what, "message": self.describe()}
