"""Run events of a run's checkpoints and of its recovery from failures: a checkpoint taken or found
incomplete, a restart, a rollback, a skipped step, a resize of the worker group, a preemption.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from workers.events.metric_labels import RestartCause
from workers.events.run_event import Json, RunEvent


@dataclass(frozen=True)
class CheckpointEvent(RunEvent):
    kind: ClassVar[str] = "checkpoint"
    step: int
    duration_s: float | None
    bytes: int | None = None  # filled in by the control plane, which sees the storage

    @property
    def message(self) -> str:
        return f"checkpoint at step {self.step}"

    def data(self) -> Json:
        out: Json = {"step": self.step, "duration_s": self.duration_s}
        if self.bytes is not None:
            out["bytes"] = self.bytes
        return out


@dataclass(frozen=True)
class CheckpointIncompleteEvent(RunEvent):
    """A checkpoint whose metadata names files the store does not hold (a shard lost with a node or
    deleted): never resumed from; the previous complete one is."""

    kind: ClassVar[str] = "checkpoint_incomplete"
    step: int
    missing: tuple[str, ...]
    resume_step: int

    @property
    def message(self) -> str:
        shown = ", ".join(self.missing[:3]) + (f" (+{len(self.missing) - 3} more)" if len(self.missing) > 3 else "")
        return (f"checkpoint at step {self.step} is incomplete (missing {shown}): "
                f"resuming from step {self.resume_step} instead")

    def data(self) -> Json:
        return {"step": self.step, "missing": list(self.missing), "resume_step": self.resume_step}


@dataclass(frozen=True)
class RestartEvent(RunEvent):
    kind: ClassVar[str] = "restart"
    restart: int
    resume_step: int
    reason: str  # what failed, as the group reported it
    cause: RestartCause
    summary: str  # the failure policy's sentence (the event's message)

    @property
    def message(self) -> str:
        return self.summary

    def data(self) -> Json:
        return {"restart": self.restart, "resume_step": self.resume_step, "reason": self.reason,
                "cause": str(self.cause)}


@dataclass(frozen=True)
class RollbackEvent(RunEvent):
    kind: ClassVar[str] = "rollback"
    from_step: int
    to_step: int
    first_bad_step: int
    reason: str  # non_finite | loss_spike (workers/training/recovery.py)
    data_window: tuple[int, int] | None
    lr_scale: float
    rollback: int  # how many rollbacks this job has had

    @property
    def message(self) -> str:
        what = "non-finite gradients" if self.reason == "non_finite" else "loss spikes"
        window = self.data_window
        return (f"rollback from step {self.from_step} to step {self.to_step}: steps {self.first_bad_step}.."
                f"{self.from_step} had {what}; "
                + (f"data batches [{window[0]}, {window[1]}) skipped" if window else "no data skipped")
                + f"; learning rate x{self.lr_scale:g}")

    def data(self) -> Json:
        return {"from_step": self.from_step, "to_step": self.to_step,
                "skipped_steps": [self.first_bad_step, self.from_step], "reason": self.reason,
                "data_window": list(self.data_window) if self.data_window else None, "lr_scale": self.lr_scale,
                "rollback": self.rollback}


SKIP_REASONS = {"non_finite": "non-finite gradients", "loss_spike": "loss spike",
                "fp16_overflow": "fp16 overflow (loss scale halved)"}


@dataclass(frozen=True)
class SkippedStepEvent(RunEvent):
    kind: ClassVar[str] = "skipped_step"
    step: int
    loss: float | None
    reason: str

    @property
    def message(self) -> str:
        return f"step {self.step}: {SKIP_REASONS.get(self.reason, self.reason)}, update skipped"

    def data(self) -> Json:
        return {"step": self.step, "loss": self.loss, "reason": self.reason}


@dataclass(frozen=True)
class ResizeEvent(RunEvent):
    kind: ClassVar[str] = "resize"
    before: Json  # layouts: dp, tp, pp, zero, strategy, world_size
    after: Json
    reason: str

    @property
    def message(self) -> str:
        return f"{self.before['world_size']} -> {self.after['world_size']} workers: {self.reason}"

    @property
    def direction(self) -> str:
        """shrink | grow | relayout (the `reason` label of trainyard_resizes_total)."""
        before, after = self.before.get("world_size"), self.after.get("world_size")
        if before is None or after is None or before == after:
            return "relayout"
        return "shrink" if after < before else "grow"

    def data(self) -> Json:
        return {"from": self.before, "to": self.after, "reason": self.reason}


@dataclass(frozen=True)
class PreemptedEvent(RunEvent):
    kind: ClassVar[str] = "preempted"
    by: str | None
    step: int
    checkpoint_step: int

    @property
    def message(self) -> str:
        return (f"preempted by job {self.by} at step {self.step}; resumes from the checkpoint at step "
                f"{self.checkpoint_step}")

    def data(self) -> Json:
        return {"by": self.by, "step": self.step, "checkpoint_step": self.checkpoint_step}
