"""Bad recommendation specs over REST: 422 naming the field and the rule, nothing stored (issue 50)."""

from __future__ import annotations

import copy

import pytest

from tests.workers.test_recommendation_spec import DLRM

CASES = [
    ({"data": {"name": "text:pystdlib"}}, "data.name", ["model 'dlrm' needs click data"]),
    ({"parallel": {"parameter_server": {"shards": 2, "mode": "async", "staleness": 3}}},
     "parallel.parameter_server.staleness", ["applies to mode 'bounded' only"]),
    ({"parallel": {"parameter_server": {"shards": 2}}, "model": {"name": "gpt"}, "data": {"name": "text:pystdlib"},
      "train": {"loss": "cross_entropy"}}, "parallel.parameter_server", ["needs a model with embedding tables"]),
]


@pytest.mark.parametrize(("keys", "field", "words"), CASES, ids=[c[1] for c in CASES])
def test_a_bad_recommendation_spec_is_a_422_naming_the_field(client, keys, field, words):  # noqa: F811
    body = {**copy.deepcopy(DLRM), **keys}
    answer = client.post("/v1/jobs", json=body)
    assert answer.status_code == 422, answer.text
    errors = {e["field"]: e["message"] for e in answer.json()["errors"]}
    assert field in errors, errors
    assert all(w in errors[field] for w in words), errors[field]
    assert client.get("/v1/jobs").json()["jobs"] == []
