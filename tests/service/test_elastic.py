"""Elastic resharding on a real multi-node Ray cluster: shrink on node loss, regrow when it returns."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from service.supervisor.policies.sizing import best_layout, relayout
from tests.helpers import spec_of


def test_relayout_keeps_the_global_batch():
    spec = spec_of(**{"resources.workers": 4, "resources.min_workers": 1, "train.global_batch_size": 48})
    for workers, (dp, micro, accum) in {4: (4, 4, 3), 3: (3, 4, 4), 2: (2, 4, 6), 1: (1, 4, 12)}.items():
        planned = relayout(spec, workers)
        assert (planned.dp, planned.train.micro_batch_size, planned.grad_accum_steps) == (dp, micro, accum)
        assert planned.train.global_batch_size == 48


RESIZABLE = [
    {},
    {"parallel.zero": 3, "parallel.dp_shard": 2, "resources.workers": 8, "train.global_batch_size": 32},  # HSDP
    {"parallel.tp": 2, "resources.workers": 8, "train.global_batch_size": 32},
    {"parallel.pp": 2, "model.n_layers": 4, "resources.workers": 8, "train.global_batch_size": 32},
    {"parallel.zero": 2, "resources.workers": 6, "train.global_batch_size": 24},
    {"parallel.cp": 2, "resources.workers": 8, "train.global_batch_size": 48},
    {"model.moe": {"experts": 4, "top_k": 2}, "parallel.ep": 4, "resources.workers": 8, "train.global_batch_size": 64},
]


@pytest.mark.parametrize("layout", RESIZABLE, ids=lambda layout: ",".join(map(str, layout.values())) or "dp")
def test_a_resize_checks_only_what_it_changes_and_agrees_with_the_whole_rule_set(layout):
    """relayout re-checks the degrees, the batch split and the layouts' rules, not the whole spec: each
    layout it plans passes the whole rule set, and it plans one wherever some layout would."""
    from workers.spec_checks import checked_spec

    spec = spec_of(**{"resources.min_workers": 1, **layout})
    for workers in range(1, spec.resources.workers + 1):
        planned = relayout(spec, workers)
        if planned is not None:
            assert planned.world_size == workers and planned.train.global_batch_size == spec.train.global_batch_size
            assert checked_spec(planned.model_dump(mode="json"), allow_fault_injection=True) == planned
        else:  # no data-parallel split of the global batch over what the model-parallel degrees leave
            cp = spec.parallel.cp
            assert all(workers % (tp * pp * c) or spec.train.global_batch_size % (workers // (tp * pp * c))
                       for tp, pp, c in ((spec.parallel.tp, spec.parallel.pp, cp), (spec.parallel.tp, 1, cp),
                                         (1, spec.parallel.pp, cp), (1, 1, cp), (1, 1, 1))), workers


def test_a_shrink_keeps_context_parallelism_where_it_divides_and_spreads_experts_over_fewer_ranks():
    cp = spec_of(**{"parallel.cp": 2, "resources.workers": 4, "resources.min_workers": 1,
                    "train.global_batch_size": 48})
    assert (relayout(cp, 2).dp, relayout(cp, 2).parallel.cp) == (1, 2)  # the sequence still split in two
    assert (relayout(cp, 3).dp, relayout(cp, 3).parallel.cp) == (3, 1)  # 3 ranks: whole sequences
    moe = spec_of(**{"model.moe": {"experts": 4, "top_k": 2}, "parallel.ep": 4, "resources.workers": 4,
                     "resources.min_workers": 1, "train.global_batch_size": 48})
    assert [relayout(moe, w).parallel.ep for w in (4, 3, 2, 1)] == [4, 1, 2, 1]  # ep divides dp


def test_best_layout_respects_the_elastic_range_and_divisibility():
    spec = spec_of(**{"resources.workers": 4, "resources.min_workers": 2})  # global batch 16
    assert best_layout(spec, 3).world_size == 2  # 16 does not split 3 ways
    assert best_layout(spec, 9).world_size == 4  # never above max_workers (= workers)
    assert best_layout(spec, 1) is None  # below min_workers


# The layout on 4 workers and the one re-planned on the 2 that survive the node loss (same global batch).
SHRINKS = {
    "dp": ({"dp": 4, "tp": 1, "pp": 1}, {"dp": 2, "tp": 1, "pp": 1}),
    "pp": ({"dp": 2, "tp": 1, "pp": 2}, {"dp": 1, "tp": 1, "pp": 2}),
    "tp": ({"dp": 2, "tp": 2, "pp": 1}, {"dp": 1, "tp": 2, "pp": 1}),
}
# Resharding changes only the order of floating-point sums (dp all-reduce vs local accumulation).
LOSS_TOLERANCE = 1e-4


def _degrees(layout: dict) -> dict:
    return {k: layout[k] for k in ("dp", "tp", "pp")}


@pytest.mark.slow
# dp in `make test`; pipeline and tensor parallel reshards in `make test-all` (the same scenario, ~1.5 min each).
@pytest.mark.parametrize("layout", ["dp", *(pytest.param(k, marks=pytest.mark.exhaustive) for k in SHRINKS if k != "dp")])
def test_node_loss_shrinks_then_regrows_and_the_loss_curve_continues(layout, tmp_path):
    out = tmp_path / "scenario.json"
    env = {**os.environ, "TRAINYARD_RAY_ADDRESS": ""}
    proc = subprocess.run([sys.executable, "-m", "tests.service.elastic_scenario", str(out), layout],
                          capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    summary, events, steps = result["summary"], result["events"], result["steps"]

    assert summary["state"] == "SUCCEEDED" and summary["steps"] == steps
    resizes = [e["data"] for e in events if e["kind"] == "resize"]
    assert [(r["from"]["world_size"], r["to"]["world_size"]) for r in resizes] == [(4, 2), (2, 4)]
    big, small = SHRINKS[layout]
    assert _degrees(resizes[0]["from"]) == big and _degrees(resizes[0]["to"]) == small
    assert _degrees(resizes[1]["to"]) == big and _degrees(summary["layout"]) == big  # grown back
    assert summary["world_size"] == 4 and summary["resizes"] == 2 and summary["restarts"] == 1
    assert result["states"].count("RECOVERING") == 2 and result["states"][-1] == "SUCCEEDED"
    # Ray declared the node dead: the cluster's fault, charged to max_infra_restarts
    assert [e["data"]["cause"] for e in events if e["kind"] == "restart"] == ["node_lost"]

    # Same global batch, same math: every step's loss matches the fault-free run.
    losses, reference = result["losses"], result["reference_losses"]
    assert sorted(map(int, losses)) == list(range(1, steps + 1))
    exact = [s for s in reference if int(s) not in result["partial_steps"]]
    # Only the steps in flight when the node died are partial: those its ranks had not yet handed over
    # (every HAND_OVER_S = 0.25 s) and those until Ray declared it dead; 11 seen on a loaded host.
    assert len(exact) >= steps - 15
    worst = max(abs(losses[s] - reference[s]) / abs(reference[s]) for s in exact)
    assert worst < LOSS_TOLERANCE, f"{layout}: loss curve deviates by {worst:.2e} relative"
