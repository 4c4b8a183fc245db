"""Each supervisor policy on hand-built statuses: pure decisions, no cluster, no waiting."""

from __future__ import annotations

import pytest

from service.supervisor.outcome import OutcomeKind
from service.supervisor.policies.failure import FailureAction, FailureStatus, RestartsUsed, on_failure
from service.supervisor.policies.pipeline_resplit import PipelineStatus, on_stage_times, resplit_spec
from service.supervisor.policies.preemption import PreemptionAction, PreemptionStatus, on_preemption
from service.supervisor.policies.reshape import CheckpointStatus, on_durable_checkpoint
from service.supervisor.policies.rollback import RollbackStatus, on_restart
from service.supervisor.policies.sizing import CapacityStatus, GrowthStatus, SizingAction, on_capacity, on_growth
from service.supervisor.policies.stragglers import STRAGGLER_POLICIES, straggler_policy
from service.supervisor.policies.stragglers.rebalance import on_slow_rank as rebalance
from service.supervisor.policies.stragglers.replace import on_slow_rank as replace
from service.supervisor.policies.stragglers.report import on_slow_rank as report
from service.supervisor.policies.stragglers.status import StragglerStatus
from tests.helpers import spec_of
from workers.events import RestartCause, StragglerAction
from workers.spec import FaultToleranceSpec, StragglerSpec

ELASTIC = spec_of(**{"resources.workers": 4, "resources.min_workers": 2})  # global batch 16


def failure(**overrides):
    return FailureStatus(**{"reason": "rank 1 failed", "used": RestartsUsed(), "limits": LIMITS, "steps_done": 10,
                            "cause": RestartCause.WORKER_LOST, **overrides})


LIMITS = FaultToleranceSpec(max_restarts=3, max_infra_restarts=2)


def test_failure_restarts_within_the_budget_and_keeps_the_cause():
    decision = on_failure(failure())
    assert decision.action == FailureAction.RESTART and decision.reason == "rank 1 failed; restart 1/3 (max_restarts)"
    assert decision.cause == RestartCause.WORKER_LOST
    spent = on_failure(failure(used=RestartsUsed(job=3)))
    assert spent.action == FailureAction.FAIL and "restart budget exhausted (max_restarts 3/3)" in spent.reason
    refused = on_failure(failure(retryable=False))
    assert refused.action == FailureAction.FAIL and "not retryable" in refused.reason


def test_the_clusters_faults_are_charged_to_their_own_budget():
    """Node and supervisor losses spend max_infra_restarts, never the job's max_restarts."""
    used = RestartsUsed(job=3)  # the job's own budget is spent
    lost = on_failure(failure(used=used, cause=RestartCause.NODE_LOST))
    assert lost.action == FailureAction.RESTART and lost.reason.endswith("restart 1/2 (max_infra_restarts)")
    used = used.plus(RestartCause.NODE_LOST).plus(RestartCause.SUPERVISOR_LOST)
    assert used == RestartsUsed(job=3, infra=2) and used.total == 5
    spent = on_failure(failure(used=used, cause=RestartCause.SUPERVISOR_LOST))
    assert spent.action == FailureAction.FAIL and "(max_infra_restarts 2/2)" in spent.reason
    assert on_failure(failure(used=RestartsUsed(infra=2))).action == FailureAction.RESTART  # a crash: the job's


def capacity(free, waited, current=ELASTIC):
    return CapacityStatus(ELASTIC, current, free, waited, settle_s=2.0, timeout_s=120.0)


def test_sizing_keeps_waits_for_freed_slots_then_shrinks_or_gives_up():
    assert on_capacity(capacity(4, 0.0)).action == SizingAction.KEEP
    assert on_capacity(capacity(2, 1.0)).action == SizingAction.WAIT  # the torn-down group's slots may return
    shrunk = on_capacity(capacity(3, 3.0))
    assert shrunk.action == SizingAction.RESIZE and shrunk.spec is not None and shrunk.spec.world_size == 2
    assert shrunk.spec.train.global_batch_size == 16  # the same problem on fewer workers
    assert on_capacity(capacity(1, 60.0)).action == SizingAction.WAIT  # below min_workers: wait for room
    assert on_capacity(capacity(1, 121.0)).action == SizingAction.GIVE_UP


def test_growth_only_to_a_larger_layout_within_the_range():
    small = spec_of(**{"resources.workers": 2})
    assert on_growth(GrowthStatus(ELASTIC, small, free_slots=2)).world_size == 4
    assert on_growth(GrowthStatus(ELASTIC, small, free_slots=1)) is None  # 3 workers: no layout for 16 samples
    assert on_growth(GrowthStatus(ELASTIC, ELASTIC, free_slots=8)) is None  # at max_workers


def test_at_a_durable_checkpoint_one_change_in_order_resplit_grow_move():
    grown = spec_of(**{"resources.workers": 4})
    assert on_durable_checkpoint(CheckpointStatus(10)) is None
    moved = on_durable_checkpoint(CheckpointStatus(10, replace=(1, "0123456789abcdef")))
    assert moved.kind == OutcomeKind.RESIZE and moved.move == (1, "0123456789abcdef") and moved.spec is None
    assert "off node 0123456789ab from the checkpoint at step 10" in moved.reason
    regrow = on_durable_checkpoint(CheckpointStatus(10, grow_to=grown, replace=(1, "n")))
    assert regrow.spec is grown and regrow.move is None and "regrowing" in regrow.reason
    resplit = on_durable_checkpoint(CheckpointStatus(10, resplit=grown, resplit_reason="re-split", replace=(1, "n")))
    assert resplit.spec is grown and resplit.reason == "re-split"


def test_preemption_stops_ranks_at_a_checkpoint_once_or_does_not_start():
    assert on_preemption(PreemptionStatus(False, True)) == PreemptionAction.NONE
    assert on_preemption(PreemptionStatus(True, False)) == PreemptionAction.REQUEUE
    assert on_preemption(PreemptionStatus(True, True)) == PreemptionAction.ASK_STOP
    assert on_preemption(PreemptionStatus(True, True, stop_sent=True)) == PreemptionAction.NONE


def test_pipeline_resplit_moves_blocks_off_the_slow_stage_once():
    spec = spec_of(**{"resources.workers": 2, "parallel.pp": 2, "model.n_layers": 4,
                      "parallel.pipeline": {"split": [3, 1], "rebalance_threshold": 0.2}, "checkpoint.every_steps": 2})
    assert on_stage_times(PipelineStatus(spec, (1.0, 1.1), 0.2)) is None  # within the threshold
    decision = on_stage_times(PipelineStatus(spec, (3.0, 1.0), 0.2))
    assert decision is not None and decision.split == (2, 2)
    assert resplit_spec(spec, decision.split).parallel.pipeline.split == [2, 2]
    assert on_stage_times(PipelineStatus(spec, (3.0, 1.0), 0.2, already_resplit=True)) is None


def test_rollback_is_reported_from_the_ledger_for_non_finite_restarts_only():
    ledger = ({"bad_steps": [6, 7], "data_window": [12, 14], "reason": "loss_spike", "lr_scale": 0.5},)
    event = on_restart(RollbackStatus(RestartCause.NON_FINITE, 5, ledger))
    assert event is not None and (event.from_step, event.to_step, event.data_window) == (7, 5, (12, 14))
    assert event.lr_scale == 0.5 and event.rollback == 1 and "loss spikes" in event.message
    assert on_restart(RollbackStatus(RestartCause.WORKER_LOST, 5, ledger)) is None
    assert on_restart(RollbackStatus(RestartCause.NON_FINITE, 5, ())) is None  # nothing recorded


def slow(**overrides):
    base = dict(rank=1, step=20, world_size=2, score=0.3, node="node-b", uneven_shares=True, dp=2, global_batch=32,
                per_sample_s=(0.01, 0.03), current_shares=(16, 16), slots_elsewhere=2)
    return StragglerStatus(**{**base, **overrides})


def test_report_only_reports():
    assert report(slow()).kind == StragglerAction.REPORTED and report(slow()).action == "reported"


def test_rebalance_splits_by_speed_unless_it_cannot_or_already_does():
    planned = rebalance(slow())
    assert planned.kind == StragglerAction.REBALANCE_PLANNED and planned.shares == (24, 8)
    assert planned.action == "rebalancing the global batch from [16, 16] to [24, 8] at the next agreement step"
    assert rebalance(slow(dp=1)).action == "reported (no data-parallel peers to take work)"
    # The step's typed capability decides, not a list of layouts the policy would have to know.
    assert rebalance(slow(uneven_shares=False)).action == "reported (the data-parallel step cannot take uneven shares)"
    assert rebalance(slow(shares_pending=(24, 8))).action == "reported (the split [24, 8] is about to apply)"
    same = rebalance(slow(current_shares=(24, 8)))
    assert same.kind == StragglerAction.REPORTED and same.shares is None


def test_replace_moves_the_rank_off_its_node_when_there_is_room():
    moved = replace(slow())
    assert moved.kind == StragglerAction.REPLACE_PLANNED and moved.replace and moved.move == (1, "node-b")
    assert replace(slow(node=None)).action == "reported (placement unknown)"
    assert replace(slow(slots_elsewhere=1)).kind == StragglerAction.REPORTED


def test_the_registry_has_a_policy_for_every_spec_policy_but_off():
    names = set(StragglerSpec.model_fields["policy"].annotation.__args__)
    assert set(STRAGGLER_POLICIES) == names - {"off"}
    assert straggler_policy("rebalance") is rebalance
    with pytest.raises(KeyError):
        straggler_policy("off")
