"""POST /v1/plans over real HTTP: the planner's table, its choice, and its errors."""

from __future__ import annotations

from tests.helpers import tiny_spec

SPEC = tiny_spec(**{"model.n_layers": 2, "model.n_heads": 4, "resources.workers": 4})


def test_plan_lists_layouts_and_choice(tenant):
    resp = tenant.post("/v1/plans", json=SPEC)
    assert resp.status_code == 200, resp.text
    plan = resp.json()
    assert plan["chosen"]["parallel"]["dp"] * plan["chosen"]["parallel"]["tp"] == 4
    strategies = {c["strategy"] for c in plan["candidates"]}
    assert {"ddp", "zero", "fsdp", "tp"} <= strategies
    for c in plan["candidates"]:
        assert c["model_state_bytes_per_rank"] > 0 and c["activation_bytes_per_rank"] > 0
        assert c["comm_bytes_per_step"] >= 0 and c["predicted_step_s"] > 0
    assert tenant.get("/v1/jobs").json()["jobs"] == []  # a plan queues nothing


def test_plan_under_an_impossible_budget_chooses_nothing(tenant):
    resp = tenant.post("/v1/plans", json=SPEC, params={"memory_gib": 1e-6})
    assert resp.status_code == 200, resp.text
    assert resp.json()["chosen"] is None and "no layout fits" in resp.json()["explanation"]


def test_plan_of_a_bad_spec_is_422_naming_the_field(tenant):
    resp = tenant.post("/v1/plans", json={**SPEC, "train": {**SPEC["train"], "global_batch_size": 6}})
    assert resp.status_code == 422, resp.text
    assert any(e["field"] == "train.global_batch_size" for e in resp.json()["errors"]), resp.json()


def test_plan_needs_a_token(queue_server):
    with queue_server.client("not-a-token") as anonymous:
        assert anonymous.post("/v1/plans", json=SPEC).status_code == 401
