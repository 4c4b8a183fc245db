"""Typed capabilities of the data-parallel step (issue 47): the supervisor's straggler policies consult
`step_capabilities`, the ranks receive typed terms (`UnevenShares`), and no rank-side code branches on a
policy's name. The capability agrees with the compatibility table's `rebalance` row."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from service.supervisor.policies.stragglers import rank_terms
from tests.helpers import tiny_spec
from tests.workers.test_compatibility import ON, spec_with
from workers.parallel.layouts import LAYOUTS, layout_of, step_capabilities
from workers.parallel.layouts.compatibility import FEATURES, composes
from workers.parallel.layouts.data_parallel_options import DataParallelOptions
from workers.parallel.layouts.layout import StepCapabilities
from workers.spec import SPEC_ERRORS, format_validation_error
from workers.spec_loading import parse_spec
from workers.training.control import UnevenShares

ROOT = Path(__file__).parents[2]
STEP_FEATURES = [f for f in FEATURES if f != "rebalance"]


@pytest.mark.parametrize("feature", STEP_FEATURES)
def test_the_step_takes_uneven_shares_where_the_table_lets_rebalance_run(feature):
    spec = parse_spec(spec_with(feature), allow_fault_injection=True)
    assert step_capabilities(spec).uneven_shares is bool(composes("rebalance", feature)), feature


def test_the_ranks_get_typed_terms_only_under_a_policy_that_needs_them():
    keys = {**ON["rebalance"], "supervisor.straggler.window": 6, "resources.workers": 4,
            "train.global_batch_size": 32}
    rebalancing = parse_spec(tiny_spec(**keys), allow_fault_injection=True)
    assert rank_terms(rebalancing, None) == UnevenShares(6)
    assert rank_terms(rebalancing, [20, 4, 4, 4]) == UnevenShares(6, (20, 4, 4, 4))  # kept over a restart
    reporting = parse_spec(spec_with(), allow_fault_injection=True)
    assert rank_terms(reporting, None) is None  # the even split, fixed: no agreement every window
    # A step that cannot take them gets none, whatever the policy (submit refuses it; a resize keeps it honest).
    zero2 = parse_spec(spec_with("zero2"), allow_fault_injection=True)
    assert rank_terms(zero2.model_copy(update={"supervisor": rebalancing.supervisor}), None) is None


RANK_SIDE = ("workers/training", "workers/runtime", "workers/data", "workers/parallel", "workers/program")


def test_no_rank_side_code_branches_on_a_straggler_policy_name():
    # workers/parallel/layouts/ checks specs (the field's value is a contract key there), not the ranks' runtime.
    named = re.compile(r"""["']rebalance["']|straggler\.policy""")
    hits = [f"{path.relative_to(ROOT)}:{n}" for top in RANK_SIDE for path in sorted((ROOT / top).rglob("*.py"))
            if "layouts" not in path.parts
            for n, line in enumerate(path.read_text().splitlines(), 1) if named.search(line)]
    assert hits == []


def test_only_the_spec_compares_the_straggler_policy_name_in_workers():
    # The spec declares the key (workers/spec/job.py: StragglerSpec.needs_uneven_shares); every rule asks the
    # step's typed capability instead.
    compares = re.compile(r"""straggler\.policy\s*[!=]=\s*["']rebalance|policy\s*==\s*["']rebalance""")
    hits = [f"{path.relative_to(ROOT)}:{n}" for path in sorted((ROOT / "workers").rglob("*.py"))
            for n, line in enumerate(path.read_text().splitlines(), 1) if compares.search(line)]
    assert hits == ["workers/spec/job.py:" + str(_line_of("workers/spec/job.py", 'return self.policy == "rebalance"'))]


def _line_of(path: str, text: str) -> int:
    return next(n for n, line in enumerate((ROOT / path).read_text().splitlines(), 1) if text in line)


@pytest.mark.parametrize("layout", LAYOUTS, ids=[layout.name for layout in LAYOUTS])
def test_every_layout_declares_whether_its_step_takes_uneven_shares(layout):
    spec = parse_spec(layout_spec(layout.name), allow_fault_injection=True)
    assert layout_of(spec) is layout
    capabilities = DataParallelOptions.of(spec).capabilities
    assert isinstance(capabilities, StepCapabilities) and capabilities == step_capabilities(spec)
    # zero 1 (see zero2 below); the parameter server's dense part is the replicate step (DDP)
    assert capabilities.uneven_shares is (layout.name in ("ddp", "zero", "parameter_server")), layout.name
    why = capabilities.why_not_uneven  # names the field (or the axis and its degree) that rules them out
    assert capabilities.uneven_shares or "parallel." in why or "tp=2" in why


LAYOUT_FEATURES = {"pipeline": ("pp",), "sdp": ("sdp",), "fsdp": ("fsdp",), "zero": ("zero1",), "tp": ("tp",),
                   "local_sgd": ("local_sgd",), "ddp": ()}


def layout_spec(name: str) -> dict:
    if name == "parameter_server":  # model 'dlrm' only: not a feature of the GPT the table's specs train
        return tiny_spec(**{"model": {"name": "dlrm"}, "data": {"name": "synthetic:clicks"}, "train.loss": "bce",
                            "resources.workers": 4, "parallel.parameter_server": {"shards": 2}})
    return spec_with(*LAYOUT_FEATURES[name])


@pytest.mark.parametrize(("feature", "reason"), [
    ("zero2", "parallel.zero 2 reduce-scatters"), ("fsdp", "parallel.zero 3 (FSDP)"), ("pp", "parallel.pp > 1"),
    ("sdp", "parallel.sdp averages"), ("tp", "tp=2"), ("local_sgd", "parallel.local_sgd averages"),
    ("cp", "cp=2"), ("ep", "ep=2"),
])
def test_rebalance_is_refused_where_the_step_cannot_take_uneven_shares(feature, reason):
    with pytest.raises(SPEC_ERRORS) as info:
        parse_spec(spec_with(feature, "rebalance"), allow_fault_injection=True)
    errors = [e for e in format_validation_error(info.value) if e["field"] == "supervisor.straggler.policy"]
    assert len(errors) == 1, format_validation_error(info.value)
    assert "'rebalance' needs a data-parallel step that takes uneven shares" in errors[0]["message"]
    assert reason in errors[0]["message"], errors[0]["message"]


@pytest.mark.parametrize("feature", ["zero1", "compression", "mixed_precision", "activation_checkpointing"])
def test_rebalance_is_accepted_where_the_step_takes_uneven_shares(feature):
    spec = parse_spec(spec_with(feature, "rebalance"), allow_fault_injection=True)
    assert step_capabilities(spec).uneven_shares


def test_a_program_is_refused_rebalance_by_its_steps_capability():
    data = {"name": "p", "resources": {"workers": 2}, "program": {"function": "m:f"},
            "supervisor": {"straggler": {"policy": "rebalance"}}}
    with pytest.raises(SPEC_ERRORS) as info:
        parse_spec(data)
    [error] = [e for e in format_validation_error(info.value) if e["field"] == "supervisor.straggler.policy"]
    assert "a program's data is its own" in error["message"], error
