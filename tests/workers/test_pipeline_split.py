"""Pipeline pieces that need no cluster: the split, stage modules, bubble theory and accounting."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from tests.helpers import spec_of
from workers.models import build_model
from workers.models.description import describe_spec_model
from workers.parallel.pipeline.bubble import (
    join_stage_reports,
    theoretical_bubble,
)
from workers.parallel.pipeline.probe import probe
from workers.parallel.pipeline.split import (
    balanced_split,
    plan_stages,
    rebalanced_split,
    stage_to_rank,
    unit_costs,
)
from workers.parallel.pipeline.stage import (
    FullNames,
    StageModule,
    pruned_copy,
    replacements_for,
)
from workers.parallel.pipeline.stage_meter import StageTimes
from workers.parallel.pipeline.summary import pipeline_summary


def pp_spec(**overrides):
    return spec_of(**{"resources.workers": 2, "parallel.pp": 2, "model.n_layers": 4, **overrides})


def brute_force_best(costs, k):
    best = float("inf")
    for cuts in itertools.combinations(range(1, len(costs)), k - 1):
        bounds = (0, *cuts, len(costs))
        best = min(best, max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:])))
    return best


def test_balanced_split_is_optimal_and_contiguous():
    rng = random.Random(0)
    for _ in range(50):
        costs = [rng.uniform(0.1, 10) for _ in range(rng.randint(2, 9))]
        k = rng.randint(1, len(costs))
        sizes = balanced_split(costs, k)
        assert len(sizes) == k and sum(sizes) == len(costs) and min(sizes) >= 1
        bounds = [0, *itertools.accumulate(sizes)]
        worst = max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:]))
        assert worst == pytest.approx(brute_force_best(costs, k))


def test_split_balances_by_cost_not_count():
    # A heavy head (large vocabulary) pushes blocks towards the first stage.
    spec = pp_spec(**{"model.vocab_size": 8192, "model.d_model": 32})
    plans = plan_stages(spec, 2)
    assert plans[0].has_embedding and plans[-1].has_head
    assert len(plans[0].blocks) > len(plans[1].blocks)
    by_count = sum(unit_costs(spec)[:3]), sum(unit_costs(spec)[3:])
    assert max(p.cost for p in plans) < max(by_count)


def test_pinned_split_and_description():
    plans = plan_stages(pp_spec(), 2, [3, 1])
    assert [p.blocks for p in plans] == [(0, 1, 2), (3,)]
    assert [p.describe() for p in plans] == ["embedding + blocks 0-2", "block 3 + head"]
    plans = plan_stages(pp_spec(), 4, [0, 2, 2, 0])
    assert [p.describe() for p in plans] == ["embedding", "blocks 0-1", "blocks 2-3", "head"]


def test_stages_keep_full_model_names_and_compose_to_the_full_forward():
    # The built-in GPT through the generic stage module (workers.parallel.pipeline.stage), bit for bit.
    spec = pp_spec()
    torch.manual_seed(0)
    full = build_model(spec)
    names = set(full.state_dict())
    idx = torch.randint(0, 256, (2, 32))
    expected = full(idx)
    desc = describe_spec_model(full, spec.model)
    seen = probe(full, desc, idx)
    plans = plan_stages(spec, 4)
    owners = []
    for r in range(2):
        mine = [p for p in plans if stage_to_rank(p.stage, 2, False) == r]
        owner = FullNames()
        owner.adopt(pruned_copy(full, replacements_for(full, desc, seen, tuple(b for p in mine for b in p.blocks),
                                                       any(p.has_embedding for p in mine),
                                                       any(p.has_head for p in mine), runnable=False)))
        owners.append(owner)
    held = [set(o.state_dict()) for o in owners]
    assert held[0] | held[1] == names and not held[0] & held[1]
    x = idx
    for plan in plans:
        x = StageModule(full, desc, seen, plan.blocks, plan.has_embedding, plan.has_head)(x)
    assert torch.equal(x, expected)


def test_v_placement_folds_back():
    assert [stage_to_rank(s, 2, True) for s in range(4)] == [0, 1, 1, 0]
    assert [stage_to_rank(s, 4, False) for s in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]


def test_theoretical_bubble_formulas_and_order():
    assert theoretical_bubble("gpipe", 2, 4) == pytest.approx(1 / 5)
    assert theoretical_bubble("1f1b", 4, 8) == pytest.approx(3 / 11)
    assert theoretical_bubble("interleaved_1f1b", 2, 4, 2) == pytest.approx(1 / 9)
    assert theoretical_bubble("zero_bubble", 2, 4, 2) == pytest.approx(1 / 25)
    assert theoretical_bubble("zbv_zero_bubble", 2, 4, 2) == 0.0
    for p, m in [(2, 2), (2, 8), (4, 8)]:
        order = [theoretical_bubble("gpipe", p, m), theoretical_bubble("1f1b", p, m),
                 theoretical_bubble("interleaved_1f1b", p, m, 2), theoretical_bubble("zero_bubble", p, m, 2),
                 theoretical_bubble("zbv_zero_bubble", p, m, 2)]
        assert order == sorted(order, reverse=True)


def test_stage_times_split_blocked_time_and_count_the_tail():
    t = StageTimes(forward_s=0.4, backward_s=0.8, wall_s=2.0,
                   p2p_calls=[(0.01, False), (0.05, True), (0.5, True), (0.01, True)])
    comm, idle = t.comm_and_idle()
    assert comm == pytest.approx(0.01 + 0.01 + 0.01 + 0.01)  # each wait counted up to the quickest wait
    assert idle == pytest.approx(0.04 + 0.49)
    r = t.report(stage=1, theoretical=0.2, makespan_s=2.5)  # finished 0.5 s before the slowest rank
    assert r["wall_s"] == 2.5 and r["idle_s"] == pytest.approx(0.53 + 0.5)
    assert r["bubble_fraction"] == pytest.approx(1.03 / 2.5)
    assert r["busy_s"] == pytest.approx(1.2)


def test_join_stage_reports_averages_replicas():
    def rep(stage, bubble, act):
        return {"stage": stage, "busy_s": 1.0, "bubble_fraction": bubble, "bubble_fraction_theoretical": 0.2,
                "activation_bytes_peak": act, "activation_microbatches_peak": 1}
    stages, measured, theory = join_stage_reports([rep(0, 0.1, 10), rep(1, 0.3, 5), rep(0, 0.3, 20)])
    assert [s["stage"] for s in stages] == [0, 1]
    assert stages[0]["bubble_fraction"] == pytest.approx(0.2) and stages[0]["activation_bytes_peak"] == 20
    assert measured == pytest.approx(0.25) and theory == 0.2
    assert join_stage_reports([]) == ([], None, None)


def test_pipeline_summary_reports_split_and_costs():
    summary = pipeline_summary(pp_spec(**{"parallel.pipeline": {"schedule": "zbv_zero_bubble"}}), [])
    assert summary["virtual_stages"] == 2 and summary["microbatches"] == 4
    assert [s["rank"] for s in summary["split"]] == [0, 1, 1, 0]
    assert sum(s["cost_share"] for s in summary["split"]) == pytest.approx(1.0)
    assert summary["bubble_fraction"] is None and summary["bubble_fraction_theoretical"] == 0.0
    assert pipeline_summary(spec_of(), []) is None


def test_rebalanced_split_moves_blocks_off_the_slow_stage():
    spec = pp_spec(**{"parallel.pipeline": {"split": [3, 1], "rebalance_threshold": 0.2},
                      "checkpoint.every_steps": 2})
    assert rebalanced_split(spec, [1.0, 1.1], 0.2) is None  # within the threshold
    # Stage 0 (embedding + 3 blocks) measured 3x stage 1 (1 block + head): move a block over.
    assert rebalanced_split(spec, [3.0, 1.0], 0.2) == [2, 2]


def test_pipeline_rebalancer_plans_once_from_a_window():
    from service.supervisor.pipeline_balance import PipelineRebalancer

    spec = pp_spec(**{"parallel.pipeline": {"split": [3, 1], "rebalance_threshold": 0.2},
                      "checkpoint.every_steps": 2})
    policy = PipelineRebalancer(spec, window=3)
    record = {"stages": [{"stage": 0, "busy_s": 0.03}, {"stage": 1, "busy_s": 0.01}]}
    assert policy.take(spec, 2) is None
    for _ in range(3):
        policy.observe(spec, record)
    new_spec, event = policy.take(spec, 4)
    assert new_spec.parallel.pipeline.split == [2, 2] and event.data()["split"] == [2, 2]
    assert "re-split blocks to [2, 2]" in event.message and "step 4" in event.message
    for _ in range(3):
        policy.observe(new_spec, record)
    assert policy.take(new_spec, 6) is None  # once per job
    assert PipelineRebalancer(spec_of()).threshold is None
