"""Bad input for the new axes over REST: 422 naming the field and the rule, and nothing stored (issue 47):
cp not dividing the sequence, ep on a dense model, ep not dividing the data-parallel ranks, a combination
the compatibility table refuses."""

from __future__ import annotations

import pytest

from tests.helpers import tiny_spec

MOE = {"model.moe": {"experts": 4, "top_k": 2}}
CASES = [
    ({"resources.workers": 2, "parallel.cp": 2, "model.seq_len": 30}, "parallel.cp",
     ["2 x cp must divide", "seq_len=30"]),
    ({"resources.workers": 2, "parallel.ep": 2}, "parallel.ep", ["needs a model with experts"]),
    ({"resources.workers": 3, "parallel.ep": 2, "train.global_batch_size": 24, **MOE}, "parallel.ep",
     ["must divide parallel.dp x parallel.cp", "dp=3"]),
    ({"resources.workers": 4, "parallel.cp": 2, "parallel.zero": 1}, "parallel.cp",
     ["not available with parallel.zero (zero1)", "cp=2"]),
    ({"resources.workers": 4, "parallel.ep": 2, "parallel.local_sgd": {"period": 2}, **MOE}, "parallel.ep",
     ["not available with parallel.local_sgd (local_sgd)"]),
]


@pytest.mark.parametrize(("keys", "field", "words"), CASES, ids=[c[1] + str(i) for i, c in enumerate(CASES)])
def test_a_bad_axis_is_a_422_naming_the_field_and_the_rule_and_stores_nothing(client, keys, field, words):
    answer = client.post("/v1/jobs", json=tiny_spec(**keys))
    assert answer.status_code == 422, answer.text
    errors = {e["field"]: e["message"] for e in answer.json()["errors"]}
    assert field in errors, errors
    assert all(w in errors[field] for w in words), errors[field]
    assert client.get("/v1/jobs").json()["jobs"] == []
