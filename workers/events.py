"""Typed events and records, from the ranks through the supervisor to REST and metrics.

Two families:
- rank telemetry (`RankStep`, `RankCheckpoint`, `RankShares`): what a rank emits and
  `WorkerGroup.poll()` returns;
- run events (`RunEvent` subclasses): what the supervisor reports. Each has a `kind`,
  a `message` and `data()`, which are exactly the `GET /v1/jobs/{id}/events` JSON
  (a public contract, pinned by tests/service/test_event_json.py); metric labels are
  read from their fields (`RestartEvent.cause`, `StragglerEvent.decision`), never from text.

This module sits in `workers/`, the lowest layer, so every layer can import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

from workers.phases import Progress

Json = dict[str, Any]


# --- rank telemetry -------------------------------------------------------------------


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


# --- causes and decisions that become metric labels -------------------------------------


class RestartCause(StrEnum):
    """Why a worker group was restarted (the `cause` label of trainyard_restarts_total)."""

    WORKER_LOST = "worker_lost"  # a rank's process died or stopped answering; its node lives on
    NODE_LOST = "node_lost"  # the Ray node a rank ran on died (the cluster's fault, not the job's)
    HANG = "hang"
    START = "start"
    NON_FINITE = "non_finite"  # non-finite gradients or loss spikes: a rollback
    CORRUPTION = "corruption"  # replicas disagree: restore the last checkpoint
    ERROR = "error"
    SUPERVISOR_LOST = "supervisor_lost"  # the control plane replaced a lost supervisor
    STORAGE = "storage"  # the checkpoint store stayed unreachable past its retry limit
    OUT_OF_MEMORY = "out_of_memory"  # a rank ran out of memory: a restart would too (never restarted)

    @property
    def rolls_back(self) -> bool:
        return self in (RestartCause.NON_FINITE, RestartCause.CORRUPTION)

    @property
    def infrastructure(self) -> bool:
        """The cluster failed the job, not the job itself: charged to `max_infra_restarts`."""
        return self in (RestartCause.NODE_LOST, RestartCause.SUPERVISOR_LOST)


class StragglerAction(StrEnum):
    """What a straggler policy did about a slow rank (the `action` label)."""

    REPORTED = "reported"
    REBALANCE_PLANNED = "rebalance_planned"
    REPLACE_PLANNED = "replace_planned"


# --- run events -----------------------------------------------------------------------


@dataclass(frozen=True)
class RunEvent:
    kind: ClassVar[str]

    @property
    def message(self) -> str:
        raise NotImplementedError

    def data(self) -> Json:
        raise NotImplementedError

    def as_json(self) -> Json:
        return {"kind": self.kind, "message": self.message, "data": self.data()}


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
class StragglerEvent(RunEvent):
    kind: ClassVar[str] = "straggler"
    rank: int
    score: float
    step: int
    policy: str
    decision: StragglerAction
    action: str  # the sentence saying what was done
    node: str | None = None  # the Ray node the rank runs on (a degraded node is the usual cause)

    @property
    def message(self) -> str:
        where = f" on node {self.node[:12]}" if self.node else ""
        return f"rank {self.rank} is slow (score {self.score:.2f}){where}: {self.action}"

    def data(self) -> Json:
        return {"rank": self.rank, "node": self.node, "score": self.score, "step": self.step,
                "policy": self.policy, "action": self.action}


@dataclass(frozen=True)
class StragglerRecoveredEvent(RunEvent):
    kind: ClassVar[str] = "straggler_recovered"
    rank: int
    score: float
    step: int

    @property
    def message(self) -> str:
        return f"rank {self.rank} recovered (score {self.score:.2f})"

    def data(self) -> Json:
        return {"rank": self.rank, "score": self.score, "step": self.step}


@dataclass(frozen=True)
class RebalanceEvent(RunEvent):
    kind: ClassVar[str] = "rebalance"
    shares: tuple[int, ...]
    before: tuple[int, ...]
    step: int

    @property
    def message(self) -> str:
        return (f"global batch rebalanced from {list(self.before)} to {list(self.shares)} after step {self.step}, "
                "without a restart")

    def data(self) -> Json:
        return {"shares": list(self.shares), "from": list(self.before), "step": self.step}


@dataclass(frozen=True)
class ReplaceEvent(RunEvent):
    kind: ClassVar[str] = "replace"
    rank: int
    from_node: str
    to_node: str | None
    step: int
    nodes: tuple[str, ...]
    excluded_nodes: tuple[str, ...]

    @property
    def message(self) -> str:
        return (f"rank {self.rank} moved from node {self.from_node[:12]} to node {(self.to_node or '?')[:12]} "
                f"at step {self.step}")

    def data(self) -> Json:
        return {"rank": self.rank, "from_node": self.from_node, "to_node": self.to_node, "step": self.step,
                "nodes": list(self.nodes), "excluded_nodes": list(self.excluded_nodes)}


@dataclass(frozen=True)
class ExcludedNodesEvent(RunEvent):
    kind: ClassVar[str] = "excluded_nodes"
    nodes: tuple[str, ...]

    @property
    def message(self) -> str:
        return f"ranks stay off {len(self.nodes)} degraded node(s) an earlier supervisor moved them from"

    def data(self) -> Json:
        return {"nodes": list(self.nodes)}


@dataclass(frozen=True)
class PipelineRebalanceEvent(RunEvent):
    kind: ClassVar[str] = "pipeline_rebalance"
    split: tuple[int, ...]
    stage_busy_s: tuple[float, ...]
    step: int

    @property
    def message(self) -> str:
        busy = ", ".join(f"{b * 1e3:.1f}" for b in self.stage_busy_s)
        return (f"pipeline stages unbalanced (busy ms per stage: {busy}); re-split blocks to {list(self.split)} "
                f"from the checkpoint at step {self.step}")

    def data(self) -> Json:
        return {"split": list(self.split), "stage_busy_s": list(self.stage_busy_s), "step": self.step}


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


@dataclass(frozen=True)
class StoreRetryEvent(RunEvent):
    """A write to the job's store failed; the rank retries after `delay_s` (bounded backoff)."""

    kind: ClassVar[str] = "store_retry"
    rank: int
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
    return f"rank {rank}" if ranks == 1 else f"rank {rank} and {ranks - 1} other ranks"


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
