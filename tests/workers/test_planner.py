"""The layout planner without a cluster: candidates, choice under a memory budget, the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from api.cli import app
from tests.helpers import tiny_spec
from workers.models import build_model
from workers.parallel.planner import GIB, candidate_layouts, estimate, plan
from workers.spec import SPEC_ERRORS
from workers.spec_loading import parse_spec

SPEC = tiny_spec(**{"model.n_layers": 2, "model.n_heads": 4, "resources.workers": 4})


def test_candidates_cover_every_strategy_and_rules_prune_them():
    layouts = candidate_layouts(4)
    assert {"dp": 4, "tp": 1, "zero": 2} in layouts and {"dp": 2, "tp": 2, "zero": 3} in layouts
    assert {"dp": 4, "tp": 1, "zero": 3, "dp_shard": 2} in layouts
    result = plan(tiny_spec(**{"model.n_layers": 2, "model.n_heads": 2, "resources.workers": 4}))
    refused = [r for r in result.rejected if r["parallel"]["tp"] == 4]
    assert refused and all("parallel.tp must divide model.n_heads" in r["reason"] for r in refused)
    assert {e.strategy for e in result.candidates} == {"ddp", "zero", "fsdp", "tp", "pipeline"}
    # pipelines of up to n_layers + 2 = 4 stages (a block, or the embedding or head, each), tp dividing 2 heads;
    # parallel: auto never chooses them
    pipelines = {(e.parallel["pp"], e.parallel["tp"]) for e in result.candidates if e.strategy == "pipeline"}
    assert pipelines == {(2, 1), (2, 2), (4, 1)}
    assert all(not e.auto_eligible for e in result.candidates if e.strategy == "pipeline")
    assert result.chosen is not None and result.chosen.parallel.get("pp", 1) == 1


def test_zero_accounting_and_ring_bytes_per_candidate():
    ddp = estimate(parse_spec({**SPEC, "parallel": {"zero": 0}}))
    psi = ddp.model_state_bytes_per_rank / 16
    assert ddp.comm_bytes_per_step == int(2 * 3 / 4 * 4 * psi)
    z1 = estimate(parse_spec({**SPEC, "parallel": {"zero": 1}}))
    z3 = estimate(parse_spec({**SPEC, "parallel": {"zero": 3}}))
    assert z1.model_state_bytes_per_rank == int((8 + 8 / 4) * psi)
    assert z3.model_state_bytes_per_rank == int(16 / 4 * psi)
    # the blocks are gathered twice (forward, backward), the root unit once: it stays gathered for backward
    root = sum(p.numel() for n, p in build_model(parse_spec(SPEC)).named_parameters() if not n.startswith("blocks."))
    assert z3.comm_bytes_per_step == pytest.approx((3 - root / psi) / 2 * ddp.comm_bytes_per_step, rel=1e-6)


def test_budget_decides_the_choice_and_is_explained():
    free = plan(SPEC)
    assert free.chosen is not None and "no memory budget" in free.explanation
    ddp = next(e for e in free.candidates if e.strategy == "ddp" and "cp" not in e.parallel)  # whole sequences
    # A budget just below DDP's needs forces a sharded layout.
    tight = plan(SPEC, memory_budget_gib=(ddp.memory_bytes_per_rank - 1) / GIB)
    assert tight.chosen is not None
    assert tight.chosen.memory_bytes_per_rank < ddp.memory_bytes_per_rank
    assert not next(e for e in tight.candidates if e.strategy == "ddp" and "cp" not in e.parallel).fits
    assert "do not fit" in tight.explanation
    none = plan(SPEC, memory_budget_gib=1e-6)
    assert none.chosen is None and "no layout fits" in none.explanation


def test_cli_plan_prints_json(tmp_path):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(SPEC))
    result = CliRunner().invoke(app, ["plan", str(path), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    chosen = out["chosen"]["parallel"]
    assert chosen["dp"] * chosen["tp"] * chosen.get("cp", 1) == 4
    for c in out["candidates"]:
        assert {"model_state_bytes_per_rank", "activation_bytes_per_rank", "comm_bytes_per_step",
                "predicted_step_s"} <= set(c)
    tight = CliRunner().invoke(app, ["plan", str(path), "--memory-gib", "0.000001"])
    assert tight.exit_code == 1 and "no layout fits" in tight.output


def test_parallel_auto_resolves_to_the_planned_layout():
    budget = plan(SPEC).candidates  # every layout fits without a budget
    ddp = next(e for e in budget if e.strategy == "ddp")
    spec = parse_spec({**SPEC, "parallel": "auto",
                       "resources": {**SPEC["resources"], "memory_per_worker_gib": (ddp.memory_bytes_per_rank - 1) / GIB}})
    assert spec.parallel.zero > 0 or spec.parallel.tp > 1  # DDP does not fit, a sharded layout does
    assert spec.dp * spec.parallel.tp == 4


def test_parallel_auto_without_a_fitting_layout_is_a_field_named_error():
    import pytest

    from workers.spec import format_validation_error

    with pytest.raises(SPEC_ERRORS) as info:
        parse_spec({**SPEC, "parallel": "auto", "resources": {**SPEC["resources"], "memory_per_worker_gib": 1e-6}})
    [error] = format_validation_error(info.value)
    assert error["field"] == "parallel" and "no layout" in error["message"] and "budget=" in error["message"]


EXAMPLE_3D = Path(__file__).resolve().parents[2] / "examples" / "hf-llama-3d.yaml"


def test_cli_plan_lists_the_example_s_own_pipeline_layout():
    """`trainyard plan` on the 3D example shows its pp2 x tp2 x dp2 among the pipeline layouts, says why
    parallel: auto passes over them, and prints no option column that every row leaves blank."""
    result = CliRunner().invoke(app, ["plan", str(EXAMPLE_3D)], env={"COLUMNS": "220"})
    assert result.exit_code == 0, result.output
    header = next(line for line in result.output.splitlines() if "strategy" in line)
    assert re.search(r"pp\W+tp\W+dp\W+zero", header), header
    assert "sdp" not in header and "None" not in result.output
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in result.output.splitlines() if "│" in line]
    pipelines = {tuple(r[1:4]) for r in rows if "pipeline" in r}
    assert ("2", "2", "2") in pipelines, result.output  # pp, tp, dp
    assert "parallel: auto does not choose a pipeline layout" in result.output
    assert "left out: pp8 x tp1 x dp1" in result.output  # 8 stages of a 4-layer model: refused, and said why
    as_json = json.loads(CliRunner().invoke(app, ["plan", str(EXAMPLE_3D), "--json"]).output)
    [three_d] = [c for c in as_json["candidates"] if (c["parallel"].get("pp"), c["parallel"]["tp"], c["parallel"]["dp"])
                 == (2, 2, 2)]
    assert three_d["strategy"] == "pipeline" and not three_d["auto_eligible"]


def test_a_sequence_too_long_for_one_rank_is_planned_with_context_parallelism():
    """4,096 tokens per sequence: under a budget that no layout holding whole sequences meets, the plan
    splits each sequence over cp ranks (its activations per rank fall as 1/cp)."""
    long = tiny_spec(**{"model.n_layers": 2, "model.n_heads": 4, "model.d_model": 64, "model.seq_len": 4096,
                        "resources.workers": 4, "train.global_batch_size": 4, "train.micro_batch_size": 1})
    free = plan(long)
    whole = [e for e in free.candidates if "cp" not in e.parallel]
    split = [e for e in free.candidates if e.parallel.get("cp", 1) > 1]
    assert whole and split
    least_whole = min(e.memory_bytes_per_rank for e in whole)
    budget = plan(long, memory_budget_gib=(least_whole - 1) / GIB)
    assert budget.chosen is not None and budget.chosen.parallel["cp"] > 1, budget.explanation
    assert not any(e.fits for e in budget.candidates if "cp" not in e.parallel)
    cp4 = next(e for e in split if e.parallel["cp"] == 4 and e.strategy == "ddp")
    cp1 = next(e for e in whole if e.strategy == "ddp" and e.parallel["tp"] == 1)
    assert cp4.activation_bytes_per_rank < cp1.activation_bytes_per_rank / 3
