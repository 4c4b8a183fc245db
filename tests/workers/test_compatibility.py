"""The compatibility table (workers/parallel/layouts/compatibility.py) is the truth about which parallel
features compose: every pair it refuses is refused at submit (by the table itself for context
parallelism, by the layouts' own rules for the older pairs), every pair it allows is accepted, and
docs/parallel.md shows its matrix."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tests.helpers import tiny_spec
from workers.parallel.layouts.compatibility import FEATURES, composes, features_of, matrix_markdown
from workers.spec import SPEC_ERRORS, format_validation_error
from workers.spec_loading import parse_spec

# Each feature as spec keys, on a model every feature can run (4 blocks, 4 heads, sequence 32).
ON: dict[str, dict] = {
    "zero1": {"parallel.zero": 1}, "zero2": {"parallel.zero": 2}, "fsdp": {"parallel.zero": 3},
    "hsdp": {"parallel.zero": 3, "parallel.dp_shard": 2}, "tp": {"parallel.tp": 2},
    "sequence_parallel": {"parallel.tp": 2, "parallel.sequence_parallel": True}, "pp": {"parallel.pp": 2},
    "cp": {"parallel.cp": 2}, "ep": {"parallel.ep": 2, "model.moe": {"experts": 4, "top_k": 2}},
    "compression": {"parallel.compression": {"kind": "fp16"}},
    "hierarchical": {"parallel.collectives": "hierarchical"},
    "local_sgd": {"parallel.local_sgd": {"period": 2}}, "sdp": {"parallel.sdp": {"coverage": 0.75}},
    "activation_checkpointing": {"parallel.activation_checkpointing": True},
    "mixed_precision": {"parallel.mixed_precision": "bf16"},
    "compile": {"train.compile": True},
    "rebalance": {"supervisor.straggler.policy": "rebalance"},
}
DEGREES = ("parallel.tp", "parallel.pp", "parallel.cp")


def spec_with(*features: str) -> dict:
    keys = {"model.n_layers": 4, "model.n_heads": 4, "model.d_model": 64, "train.global_batch_size": 32}
    for f in features:
        keys.update(ON[f])
    workers = 4  # dp 4 before the model-parallel degrees (HSDP's dp_shard 2, SDP's four workers)
    for degree in DEGREES:
        workers *= keys.get(degree, 1)
    return tiny_spec(**keys, **{"resources.workers": workers})


def test_every_feature_is_named_by_its_keys():
    assert set(ON) == set(FEATURES)
    for name in FEATURES:
        assert name in features_of(parse_spec(spec_with(name), allow_fault_injection=True)), name


PAIRS = [(a, b) for a, b in itertools.combinations(FEATURES, 2) if composes(a, b) is not None]


@pytest.mark.parametrize(("a", "b"), PAIRS, ids=[f"{a}+{b}" for a, b in PAIRS])
def test_the_table_says_what_submit_does(a, b):
    data = spec_with(a, b)
    if composes(a, b):
        parse_spec(data, allow_fault_injection=True)
        return
    with pytest.raises(SPEC_ERRORS) as info:
        parse_spec(data, allow_fault_injection=True)
    fields = {e["field"] for e in format_validation_error(info.value)}
    named = {key for f in (a, b) for key in ON[f]} | {FEATURES[f][0] for f in (a, b)}
    assert fields & named, (a, b, fields)  # refused naming a field of one of the two


def test_docs_show_the_matrix():
    page = (Path(__file__).parents[2] / "docs" / "parallel.md").read_text()
    assert matrix_markdown() in page, "docs/parallel.md: paste workers.parallel.layouts.compatibility.matrix_markdown()"
