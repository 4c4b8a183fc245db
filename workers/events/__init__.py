"""Typed events and records, from the ranks through the supervisor to REST and metrics.

Two families:
- rank telemetry (`RankStep`, `RankCheckpoint`, `RankShares`): what a rank emits and
  `WorkerGroup.poll()` returns (rank_telemetry.py);
- run events (`RunEvent` subclasses, run_event.py): what the supervisor reports. Each has a `kind`,
  a `message` and `data()`, which are exactly the `GET /v1/jobs/{id}/events` JSON
  (a public contract, pinned by tests/service/test_event_json.py); metric labels are
  read from their fields (`RestartEvent.cause`, `StragglerEvent.decision`: metric_labels.py), never
  from text.
  They are grouped by what they report: recovery_events.py (checkpoints, restarts, rollbacks,
  resizes, preemption), straggler_events.py, store_events.py, progress_events.py.

This package is the import surface (`from workers.events import X`); its modules hold the
definitions. It sits in `workers/`, the lowest layer, so every layer can import it.
"""

from __future__ import annotations

from workers.events.metric_labels import RestartCause, StragglerAction
from workers.events.progress_events import PhaseEvent, ValidationEvent
from workers.events.rank_telemetry import RankCheckpoint, RankEvent, RankNotice, RankProgress, RankShares, RankStep
from workers.events.recovery_events import (
    SKIP_REASONS,
    CheckpointEvent,
    CheckpointIncompleteEvent,
    PreemptedEvent,
    ResizeEvent,
    RestartEvent,
    RollbackEvent,
    SkippedStepEvent,
)
from workers.events.run_event import Json, RunEvent
from workers.events.store_events import StoreRecoveredEvent, StoreRetryEvent, TrackingDroppedEvent
from workers.events.straggler_events import (
    ExcludedNodesEvent,
    PipelineRebalanceEvent,
    RebalanceEvent,
    ReplaceEvent,
    StragglerEvent,
    StragglerRecoveredEvent,
)

__all__ = [
    "Json", "RunEvent",
    "RankStep", "RankCheckpoint", "RankShares", "RankNotice", "RankProgress", "RankEvent",
    "RestartCause", "StragglerAction",
    "CheckpointEvent", "CheckpointIncompleteEvent", "RestartEvent", "RollbackEvent", "SKIP_REASONS",
    "SkippedStepEvent", "ResizeEvent", "PreemptedEvent",
    "StragglerEvent", "StragglerRecoveredEvent", "RebalanceEvent", "ReplaceEvent", "ExcludedNodesEvent",
    "PipelineRebalanceEvent",
    "StoreRetryEvent", "StoreRecoveredEvent", "TrackingDroppedEvent",
    "PhaseEvent", "ValidationEvent",
]
