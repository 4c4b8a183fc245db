"""The job's phase over REST on a real service and a real local Ray (issue 46): while the final validation
walks the whole split (several seconds, many reconciler passes), GET /v1/jobs/{id} names it with typed
figures that advance (`evaluating (final validation) 1,200/3,125 batches`); once it has ended, `phase` is
null (and while it trains: service/supervisor/progress_watch.py, tests/service/test_progress_policy.py)."""

from __future__ import annotations

import time

import pytest

from tests.helpers import tiny_spec
from tests.live import Server, create_pg_schema, drop_pg_schema, pg_schema_url

pytestmark = [pytest.mark.slow, pytest.mark.exhaustive]  # a real service and job: ~1 min, make test-all


@pytest.fixture(scope="module")
def server(tmp_path_factory, ray_cluster):
    schema = create_pg_schema()
    srv = Server(tmp_path_factory.mktemp("phase"), pg_schema_url(schema), ray_cluster.get_runtime_context().gcs_address)
    srv.start()
    yield srv
    srv.stop()
    drop_pg_schema(schema)


@pytest.mark.timeout(600)
def test_a_long_final_validation_is_named_in_the_job_view_while_it_runs(server):
    spec = tiny_spec(**{"name": "phased", "model": {"name": "gpt", "n_layers": 2, "d_model": 64, "n_heads": 4,
                                                    "seq_len": 16},
                        "data": {"name": "text:pystdlib"}, "train.steps": 4, "train.global_batch_size": 16,
                        "train.micro_batch_size": 2, "train.eval_batches": "all", "parallel.dp": 2,
                        "parallel.zero": 3, "resources.workers": 2})
    seen: list[dict] = []  # each poll of the running job: (step, phase)
    with server.client() as c:
        resp = c.post("/v1/jobs", json=spec)
        assert resp.status_code == 201, resp.text
        job_id = resp.json()["id"]
        deadline = time.monotonic() + 480
        while (job := c.get(f"/v1/jobs/{job_id}").json())["state"] not in {"SUCCEEDED", "FAILED", "CANCELLED"}:
            assert time.monotonic() < deadline, job
            if job["state"] == "RUNNING":
                seen.append({"step": job["step"], "phase": job["phase"]})
            time.sleep(0.2)
        final = c.get(f"/v1/jobs/{job_id}/events").json()["events"]
    assert job["state"] == "SUCCEEDED", job["error"]
    assert job["phase"] is None  # ended: no phase
    validating = [s["phase"] for s in seen if s["phase"] and s["phase"]["name"] == "evaluating"
                  and s["phase"]["what"] == "final validation"]
    assert len(validating) >= 3, seen  # seen on several polls: the view follows the phase while it lasts
    [covered] = [e["data"] for e in final if e["kind"] == "validation" and e["data"]["final"]]
    for p in validating:
        assert p["unit"] == "batches" and p["total"] == covered["batches"] and 0 <= p["done"] <= p["total"], p
        assert p["step"] == 4 and p["message"] == f"evaluating (final validation) {p['done']:,}/{p['total']:,} batches"
    assert len({p["done"] for p in validating}) >= 2, validating  # it advances between polls
