"""Elastic resharding on a real multi-node Ray cluster: shrink on node loss, regrow when it returns."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from service.supervisor.elastic import best_layout, relayout
from tests.helpers import spec_of


def test_relayout_keeps_the_global_batch():
    spec = spec_of(**{"resources.workers": 4, "resources.min_workers": 1, "train.global_batch_size": 48})
    for workers, (dp, micro, accum) in {4: (4, 4, 3), 3: (3, 4, 4), 2: (2, 4, 6), 1: (1, 4, 12)}.items():
        planned = relayout(spec, workers)
        assert (planned.dp, planned.train.micro_batch_size, planned.grad_accum_steps) == (dp, micro, accum)
        assert planned.train.global_batch_size == 48


def test_best_layout_respects_the_elastic_range_and_divisibility():
    spec = spec_of(**{"resources.workers": 4, "resources.min_workers": 2})  # global batch 16
    assert best_layout(spec, 3).world_size == 2  # 16 does not split 3 ways
    assert best_layout(spec, 9).world_size == 4  # never above max_workers (= workers)
    assert best_layout(spec, 1) is None  # below min_workers


@pytest.mark.slow
def test_node_loss_shrinks_then_regrows_and_the_loss_curve_continues(tmp_path):
    out = tmp_path / "scenario.json"
    env = {**os.environ, "TRAINYARD_RAY_ADDRESS": ""}
    proc = subprocess.run([sys.executable, "-m", "tests.service.elastic_scenario", str(out)],
                          capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    summary, events = result["summary"], result["events"]

    assert summary["state"] == "SUCCEEDED" and summary["steps"] == 200
    resizes = [e["data"] for e in events if e["kind"] == "resize"]
    assert [(r["from"]["world_size"], r["to"]["world_size"]) for r in resizes] == [(4, 2), (2, 4)]
    assert resizes[0]["from"]["dp"] == 4 and resizes[0]["to"]["dp"] == 2
    assert summary["world_size"] == 4 and summary["resizes"] == 2 and summary["restarts"] == 1
    assert result["states"].count("RECOVERING") == 2 and result["states"][-1] == "SUCCEEDED"

    # Same global batch, same math: every step's loss matches the fault-free run.
    losses, reference = result["losses"], result["reference_losses"]
    assert sorted(map(int, losses)) == list(range(1, 201))
    exact = [s for s in reference if int(s) not in result["partial_steps"]]
    assert len(exact) >= 190  # only the steps in flight when the node died are partial
    worst = max(abs(losses[s] - reference[s]) / abs(reference[s]) for s in exact)
    assert worst < 1e-4, f"loss curve deviates by {worst:.2e} relative"
