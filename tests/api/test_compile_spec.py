"""`train.compile` over REST (issue 49): default false, accepted with DDP and FSDP, and a 422 naming the field
and the rule where compiled blocks cannot run (tp's dispatch-mode meter; pipeline and SDP stages, which
parallelize does not build), storing nothing."""

from __future__ import annotations

import pytest

from tests.helpers import spec_of, tiny_spec

BASE = {"model.n_layers": 2, "model.n_heads": 2, "resources.workers": 2}
REFUSED = [
    ({"parallel.tp": 2}, ["not available with parallel.tp (tp)", "TorchDispatchMode"]),
    ({"parallel.pp": 2}, ["not available with parallel.pp (pp)", "not built by parallelize"]),
]


def test_compile_is_off_by_default_and_a_bool():
    assert spec_of().train.compile is False
    assert spec_of(**{"train.compile": True}).train.compile is True


@pytest.mark.parametrize("keys", [{}, {"parallel.zero": 3}], ids=["ddp", "fsdp"])
def test_compile_is_accepted_with_data_parallelism(keys):
    assert spec_of(**BASE, **keys, **{"train.compile": True}).train.compile is True


@pytest.mark.parametrize(("keys", "words"), REFUSED, ids=[next(iter(k)) for k, _ in REFUSED])
def test_compile_where_blocks_cannot_compile_is_a_422_naming_the_field(client, keys, words):
    answer = client.post("/v1/jobs", json=tiny_spec(**BASE, **keys, **{"train.compile": True}))
    assert answer.status_code == 422, answer.text
    errors = {e["field"]: e["message"] for e in answer.json()["errors"]}
    assert "train.compile" in errors, errors
    assert all(w in errors["train.compile"] for w in words), errors["train.compile"]
    assert client.get("/v1/jobs").json()["jobs"] == []


def test_compile_that_is_not_a_bool_is_a_422_naming_the_field(client):
    answer = client.post("/v1/jobs", json=tiny_spec(**{"train.compile": "fast"}))
    assert answer.status_code == 422, answer.text
    assert "train.compile" in {e["field"] for e in answer.json()["errors"]}
