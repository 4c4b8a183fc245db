"""The bidirectional and asynchronous pipeline schedules over REST (issue 50): `chimera`, `pipedream` and
`pipedream_2bw` accepted where they run, and a 422 naming the field and the rule where they cannot,
storing nothing."""

from __future__ import annotations

import pytest

from tests.helpers import tiny_spec

BASE = {"model.n_layers": 4, "model.n_heads": 2, "resources.workers": 2, "parallel.pp": 2,
        "train.global_batch_size": 8, "train.micro_batch_size": 2}
REFUSED = [  # (schedule, keys, field, words)
    ("chimera", {"parallel.pp": 3, "resources.workers": 3, "train.global_batch_size": 12},
     "parallel.pp", ["must be even", "pp=3"]),
    ("chimera", {"parallel.tp": 2, "resources.workers": 4}, "parallel.tp", ["'chimera'", "tp=2"]),
    ("pipedream", {"resources.workers": 4, "resources.min_workers": 2}, "resources.min_workers",
     ["must equal resources.workers", "min_workers=2"]),
    ("pipedream_2bw", {"train.global_batch_size": 2}, "train.global_batch_size",
     ["at least parallel.pp micro-batches", "per step=1"]),
]


@pytest.mark.parametrize("schedule", ["chimera", "pipedream", "pipedream_2bw"])
def test_each_schedule_is_accepted_where_it_runs(client, schedule):
    answer = client.post("/v1/jobs", json=tiny_spec(**BASE, **{"parallel.pipeline": {"schedule": schedule}}))
    assert answer.status_code == 201, answer.text
    job = client.get(f"/v1/jobs/{answer.json()['id']}").json()
    assert job["spec"]["parallel"]["pipeline"]["schedule"] == schedule


@pytest.mark.parametrize(("schedule", "keys", "field", "words"), REFUSED, ids=[f"{s}-{f}" for s, _, f, _ in REFUSED])
def test_where_it_cannot_run_is_a_422_naming_the_field(client, schedule, keys, field, words):
    spec = tiny_spec(**{**BASE, **keys, "parallel.pipeline": {"schedule": schedule}})
    answer = client.post("/v1/jobs", json=spec)
    assert answer.status_code == 422, answer.text
    errors = {e["field"]: e["message"] for e in answer.json()["errors"]}
    assert field in errors, errors
    assert all(w in errors[field] for w in words), errors[field]
    assert client.get("/v1/jobs").json()["jobs"] == []
