"""The event JSON of `GET /v1/jobs/{id}/events` is a public contract: kind, message and data keys of
every event the supervisor reports, pinned here as the untyped supervisor wrote them before."""

from __future__ import annotations

import json

import pytest

from workers.events import (
    CheckpointEvent,
    CheckpointIncompleteEvent,
    ExcludedNodesEvent,
    PhaseEvent,
    PipelineRebalanceEvent,
    PreemptedEvent,
    RebalanceEvent,
    ReplaceEvent,
    ResizeEvent,
    RestartCause,
    RestartEvent,
    RollbackEvent,
    SkippedStepEvent,
    StoreRecoveredEvent,
    StoreRetryEvent,
    StragglerAction,
    StragglerEvent,
    StragglerRecoveredEvent,
    TrackingDroppedEvent,
    ValidationEvent,
)
from workers.phases import Phase, Progress

LAYOUT_4 = {"dp": 4, "tp": 1, "pp": 1, "zero": 0, "strategy": "ddp", "world_size": 4}
LAYOUT_2 = {"dp": 2, "tp": 1, "pp": 1, "zero": 0, "strategy": "ddp", "world_size": 2}

CASES = [
    (CheckpointEvent(50, 1.25),
     {"kind": "checkpoint", "message": "checkpoint at step 50", "data": {"step": 50, "duration_s": 1.25}}),
    (RestartEvent(1, 50, "rank 1 failed: ActorDiedError: died", RestartCause.WORKER_LOST,
                  "rank 1 failed: ActorDiedError: died; restart 1/3"),
     {"kind": "restart", "message": "rank 1 failed: ActorDiedError: died; restart 1/3",
      "data": {"restart": 1, "resume_step": 50, "reason": "rank 1 failed: ActorDiedError: died",
               "cause": "worker_lost"}}),
    (ResizeEvent(LAYOUT_4, LAYOUT_2, "only 2 worker slots available"),
     {"kind": "resize", "message": "4 -> 2 workers: only 2 worker slots available",
      "data": {"from": LAYOUT_4, "to": LAYOUT_2, "reason": "only 2 worker slots available"}}),
    (StragglerEvent(1, 0.3312, 24, "rebalance", StragglerAction.REBALANCE_PLANNED,
                    "rebalancing the global batch from [16, 16] to [24, 8] at the next agreement step",
                    "0123456789abcdef"),
     {"kind": "straggler",
      "message": "rank 1 is slow (score 0.33) on node 0123456789ab: rebalancing the global batch from [16, 16] to "
                 "[24, 8] at the next agreement step",
      "data": {"rank": 1, "node": "0123456789abcdef", "score": 0.3312, "step": 24, "policy": "rebalance",
               "action": "rebalancing the global batch from [16, 16] to [24, 8] at the next agreement step"}}),
    (StragglerRecoveredEvent(1, 0.912, 40),
     {"kind": "straggler_recovered", "message": "rank 1 recovered (score 0.91)",
      "data": {"rank": 1, "score": 0.912, "step": 40}}),
    (RebalanceEvent((24, 8), (16, 16), 26),
     {"kind": "rebalance", "message": "global batch rebalanced from [16, 16] to [24, 8] after step 26, without a "
                                      "restart",
      "data": {"shares": [24, 8], "from": [16, 16], "step": 26}}),
    (ReplaceEvent(1, "0123456789abcdef", "fedcba9876543210", 30, ("aaaa", "fedcba9876543210"), ("0123456789abcdef",)),
     {"kind": "replace", "message": "rank 1 moved from node 0123456789ab to node fedcba987654 at step 30",
      "data": {"rank": 1, "from_node": "0123456789abcdef", "to_node": "fedcba9876543210", "step": 30,
               "nodes": ["aaaa", "fedcba9876543210"], "excluded_nodes": ["0123456789abcdef"]}}),
    (ReplaceEvent(1, "0123456789abcdef", None, 30, (), ()),
     {"kind": "replace", "message": "rank 1 moved from node 0123456789ab to node ? at step 30",
      "data": {"rank": 1, "from_node": "0123456789abcdef", "to_node": None, "step": 30, "nodes": [],
               "excluded_nodes": []}}),
    (ExcludedNodesEvent(("node-a", "node-b")),
     {"kind": "excluded_nodes", "message": "ranks stay off 2 degraded node(s) an earlier supervisor moved them from",
      "data": {"nodes": ["node-a", "node-b"]}}),
    (PipelineRebalanceEvent((2, 2), (0.03, 0.01), 4),
     {"kind": "pipeline_rebalance",
      "message": "pipeline stages unbalanced (busy ms per stage: 30.0, 10.0); re-split blocks to [2, 2] from the "
                 "checkpoint at step 4",
      "data": {"split": [2, 2], "stage_busy_s": [0.03, 0.01], "step": 4}}),
    (RollbackEvent(7, 5, 6, "non_finite", (12, 14), 0.5, 1),
     {"kind": "rollback",
      "message": "rollback from step 7 to step 5: steps 6..7 had non-finite gradients; data batches [12, 14) "
                 "skipped; learning rate x0.5",
      "data": {"from_step": 7, "to_step": 5, "skipped_steps": [6, 7], "reason": "non_finite",
               "data_window": [12, 14], "lr_scale": 0.5, "rollback": 1}}),
    (RollbackEvent(9, 5, 8, "loss_spike", None, 1.0, 2),
     {"kind": "rollback",
      "message": "rollback from step 9 to step 5: steps 8..9 had loss spikes; no data skipped; learning rate x1",
      "data": {"from_step": 9, "to_step": 5, "skipped_steps": [8, 9], "reason": "loss_spike",
               "data_window": None, "lr_scale": 1.0, "rollback": 2}}),
    (PreemptedEvent("job-high", 12, 10),
     {"kind": "preempted", "message": "preempted by job job-high at step 12; resumes from the checkpoint at step 10",
      "data": {"by": "job-high", "step": 12, "checkpoint_step": 10}}),
    (SkippedStepEvent(6, float("nan"), "non_finite"),
     {"kind": "skipped_step", "message": "step 6: non-finite gradients, update skipped",
      "data": {"step": 6, "loss": float("nan"), "reason": "non_finite"}}),
    (SkippedStepEvent(6, 2.5, "fp16_overflow"),
     {"kind": "skipped_step", "message": "step 6: fp16 overflow (loss scale halved), update skipped",
      "data": {"step": 6, "loss": 2.5, "reason": "fp16_overflow"}}),
    (TrackingDroppedEvent("mlflow", 12, (4, 7), "ConnectionError: refused"),
     {"kind": "tracking_dropped",
      "message": "mlflow logging dropped 12 record(s) (steps 4..7) after retries: ConnectionError: refused",
      "data": {"sink": "mlflow", "dropped": 12, "steps": [4, 7], "error": "ConnectionError: refused"}}),
    (StoreRetryEvent(1, "checkpoint step-40 (rank 1's shards)", 2, 1.0, "ConnectionError: refused"),
     {"kind": "store_retry",
      "message": "rank 1: checkpoint step-40 (rank 1's shards) failed (ConnectionError: refused); retry 2 in 1.0s",
      "data": {"rank": 1, "what": "checkpoint step-40 (rank 1's shards)", "attempt": 2, "delay_s": 1.0,
               "error": "ConnectionError: refused", "ranks": 1}}),
    (StoreRecoveredEvent(0, "checkpoint step-40 (metadata)", 3, 4.5),
     {"kind": "store_recovered", "message": "rank 0: checkpoint step-40 (metadata) written after 3 retries (4.5s)",
      "data": {"rank": 0, "what": "checkpoint step-40 (metadata)", "retries": 3, "after_s": 4.5, "ranks": 1}}),
    (CheckpointIncompleteEvent(20, ("__1_0.distcp",), 10),
     {"kind": "checkpoint_incomplete",
      "message": "checkpoint at step 20 is incomplete (missing __1_0.distcp): resuming from step 10 instead",
      "data": {"step": 20, "missing": ["__1_0.distcp"], "resume_step": 10}}),
    (PhaseEvent(0, Progress(Phase.EVALUATING, 1200, 3125, 4, "final validation"), 12.04),
     {"kind": "phase", "message": "rank 0: evaluating (final validation) 1,200/3,125 batches (12s in this phase)",
      "data": {"rank": 0, "phase": "evaluating", "done": 1200, "total": 3125, "unit": "batches", "step": 4,
               "what": "final validation", "elapsed_s": 12.04}}),
    (ValidationEvent(40, 2.5, 128, 4, 16, 12500, False),
     {"kind": "validation", "message": "validation at step 40: loss 2.5000 over 128 of 12,500 samples "
                                       "(4 batches of 16 per rank)",
      "data": {"step": 40, "loss": 2.5, "samples": 128, "batches": 4, "batch_size": 16, "split_samples": 12500,
               "final": False}}),
]


@pytest.mark.parametrize(("event", "expected"), CASES, ids=[type(e).__name__ for e, _ in CASES])
def test_event_json_is_the_public_contract(event, expected):
    got = event.as_json()
    # json round trip: what REST serves (NaN compares through its text form)
    assert json.dumps(got, sort_keys=True) == json.dumps(expected, sort_keys=True)
    assert sorted(got["data"]) == sorted(expected["data"])


def test_every_event_kind_is_pinned():
    from workers import events

    kinds = {cls.kind for cls in vars(events).values()
             if isinstance(cls, type) and issubclass(cls, events.RunEvent) and cls is not events.RunEvent}
    assert kinds == {e.kind for e, _ in CASES}


def test_progress_describes_itself_in_its_phase_unit():
    assert Progress(Phase.UPLOADING_CHECKPOINT, 4_000_000, 10_000_000, 40, "step 40").describe() == (
        "uploading checkpoint (step 40) 40% of 10.0 MB")
    assert Progress(Phase.EVALUATING, 1200, 3125).describe() == "evaluating 1,200/3,125 batches"
    assert Progress(Phase.BUILDING_MODEL).describe() == "building the model"


def test_a_checkpoint_event_carries_its_bytes_once_the_control_plane_measured_them():
    assert CheckpointEvent(50, 1.0, bytes=123).data() == {"step": 50, "duration_s": 1.0, "bytes": 123}
