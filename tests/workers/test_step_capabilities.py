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
from workers.parallel.layouts import step_capabilities
from workers.parallel.layouts.compatibility import FEATURES, composes
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
