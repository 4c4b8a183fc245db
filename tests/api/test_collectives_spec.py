"""`parallel.collectives` over REST (issue 50): default flat, hierarchical accepted with plain data parallelism
(and with fp16 compression on its cross-node stage), and a 422 naming the field and the rule for a bad value
and for what it does not combine with, storing nothing."""

from __future__ import annotations

import pytest

from tests.helpers import spec_of, tiny_spec

BASE = {"model.n_layers": 2, "model.n_heads": 2, "resources.workers": 2}
HIER = {"parallel.collectives": "hierarchical"}
REFUSED = [
    ({"parallel.compression": {"kind": "powersgd"}}, ["'powersgd'", "cross-node"]),
    ({"parallel.zero": 1}, ["not available with parallel.zero (zero1)", "plain data parallelism"]),
    ({"parallel.zero": 3}, ["not available with parallel.zero (fsdp)"]),
    ({"parallel.tp": 2, "resources.workers": 4}, ["not available with parallel.tp (tp)"]),
    ({"parallel.pp": 2}, ["not available with parallel.pp (pp)"]),
    ({"parallel.local_sgd": {"period": 2}}, ["not available with parallel.local_sgd"]),
]


def test_collectives_default_to_flat():
    assert spec_of().parallel.collectives == "flat"
    assert spec_of(**BASE, **HIER).parallel.collectives == "hierarchical"


def test_hierarchical_is_accepted_with_plain_data_parallelism_and_fp16_across_nodes(client):
    for keys in ({}, {"parallel.compression": {"kind": "fp16"}}):
        answer = client.post("/v1/jobs", json=tiny_spec(**BASE, **HIER, **keys))
        assert answer.status_code == 201, answer.text


@pytest.mark.parametrize(("keys", "words"), REFUSED, ids=[str(next(iter(k.values()))) for k, _ in REFUSED])
def test_hierarchical_where_it_cannot_run_is_a_422_naming_the_field(client, keys, words):
    answer = client.post("/v1/jobs", json=tiny_spec(**{**BASE, **keys}, **HIER))
    assert answer.status_code == 422, answer.text
    errors = {e["field"]: e["message"] for e in answer.json()["errors"]}
    assert "parallel.collectives" in errors, errors
    assert all(w in errors["parallel.collectives"] for w in words), errors["parallel.collectives"]
    assert client.get("/v1/jobs").json()["jobs"] == []


def test_an_unknown_collectives_value_is_a_422_naming_the_field(client):
    answer = client.post("/v1/jobs", json=tiny_spec(**BASE, **{"parallel.collectives": "ring"}))
    assert answer.status_code == 422, answer.text
    errors = {e["field"]: e["message"] for e in answer.json()["errors"]}
    assert "parallel.collectives" in errors, errors
    assert "hierarchical" in errors["parallel.collectives"], errors
