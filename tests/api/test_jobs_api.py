"""Submitting, reading, listing and cancelling over real HTTP (scheduler paused), on both databases."""

from __future__ import annotations

import json
import uuid
from concurrent.futures import ThreadPoolExecutor

from tests.api.conftest import QUOTA
from tests.helpers import tiny_spec


def test_submit_get_list(tenant):
    resp = tenant.post("/v1/jobs", json=tiny_spec(), params={"priority": 3})
    assert resp.status_code == 201, resp.text
    job = resp.json()
    assert resp.headers["location"] == f"/v1/jobs/{job['id']}"
    assert job["state"] == "QUEUED" and job["priority"] == 3 and job["total_steps"] == 20
    assert job["spec"]["model"]["d_model"] == 32  # the resolved spec, defaults filled in
    assert job["spec"]["checkpoint"] == {"every_steps": 0, "keep": 2}
    got = tenant.get(f"/v1/jobs/{job['id']}").json()
    assert got["id"] == job["id"] and got["created_at"].endswith("+00:00")
    listed = tenant.get("/v1/jobs").json()["jobs"]
    assert [j["id"] for j in listed] == [job["id"]] and "spec" not in listed[0]
    assert tenant.get("/v1/jobs", params={"state": "RUNNING"}).json()["jobs"] == []
    events = tenant.get(f"/v1/jobs/{job['id']}/events").json()["events"]
    assert [(e["kind"], e["state"]) for e in events] == [("state", "QUEUED")]


def test_idempotency_key_same_body_same_job_different_body_409(tenant, counts):
    key = uuid.uuid4().hex
    first = tenant.post("/v1/jobs", json=tiny_spec(), headers={"Idempotency-Key": key})
    again = tenant.post("/v1/jobs", json=tiny_spec(), headers={"Idempotency-Key": key})
    assert first.status_code == again.status_code == 201
    assert first.json()["id"] == again.json()["id"]
    assert again.headers["idempotent-replayed"] == "true"
    before = counts()
    changed = tenant.post("/v1/jobs", json=tiny_spec(**{"train.steps": 21}), headers={"Idempotency-Key": key})
    assert changed.status_code == 409 and "different job spec" in changed.json()["detail"]
    assert counts() == before
    assert len(tenant.get("/v1/jobs").json()["jobs"]) == 1


def test_concurrent_submits_with_one_key_make_one_job(tenant):
    key = uuid.uuid4().hex
    with ThreadPoolExecutor(8) as pool:
        resps = list(pool.map(lambda _: tenant.post("/v1/jobs", json=tiny_spec(), headers={"Idempotency-Key": key}),
                              range(8)))
    assert {r.status_code for r in resps} == {201}
    assert len({r.json()["id"] for r in resps}) == 1
    assert len(tenant.get("/v1/jobs").json()["jobs"]) == 1


def test_quota_is_429_and_cancelling_frees_it(tenant, counts):
    jobs = [tenant.post("/v1/jobs", json=tiny_spec()).json() for _ in range(QUOTA)]
    before = counts()
    over = tenant.post("/v1/jobs", json=tiny_spec())
    assert over.status_code == 429 and "limit" in over.json()["detail"] and over.headers["retry-after"]
    assert counts() == before
    cancelled = tenant.post(f"/v1/jobs/{jobs[0]['id']}/cancel")
    assert cancelled.status_code == 202 and cancelled.json()["state"] == "CANCELLED"
    assert tenant.post("/v1/jobs", json=tiny_spec()).status_code == 201


def test_cancel_queued_job_is_recorded(tenant):
    job = tenant.post("/v1/jobs", json=tiny_spec()).json()
    assert tenant.post(f"/v1/jobs/{job['id']}/cancel").json()["state"] == "CANCELLED"
    events = tenant.get(f"/v1/jobs/{job['id']}/events").json()["events"]
    assert [e["state"] for e in events] == ["QUEUED", "CANCELLED"]
    assert events[1]["data"] == {"from": "QUEUED", "to": "CANCELLED"}
    assert tenant.get(f"/v1/jobs/{job['id']}").json()["finished_at"]


def test_artefact_endpoints_of_a_queued_job(tenant):
    job = tenant.post("/v1/jobs", json=tiny_spec()).json()
    assert tenant.get(f"/v1/jobs/{job['id']}/metrics").json()["points"] == []
    assert tenant.get(f"/v1/jobs/{job['id']}/logs").text == ""
    ckpt = tenant.get(f"/v1/jobs/{job['id']}/checkpoints").json()
    assert ckpt["checkpoints"] == [] and ckpt["model"]["available"] is False


def test_health_readiness_and_prometheus(queue_server, tenant):
    import httpx

    tenant.post("/v1/jobs", json=tiny_spec())
    assert httpx.get(f"{queue_server.url}/healthz").json() == {"status": "ok"}
    ready = httpx.get(f"{queue_server.url}/readyz").json()
    assert ready == {"ready": True, "checks": {"database": "ok", "ray": "ok"}}
    text = httpx.get(f"{queue_server.url}/metrics").text
    queued = [line for line in text.splitlines() if line.startswith('trainyard_jobs{state="QUEUED"}')]
    assert queued and float(queued[0].split()[-1]) >= 1


def test_a_job_read_is_the_same_on_the_fast_and_the_full_path(queue_server):
    """A token's first read takes the full route (the token is not cached yet); the next is the
    fast path's (api/http/job_read_fast_path.py). Same bytes, same headers, same /metrics route."""
    import re

    import httpx

    with queue_server.client() as admin:
        created = admin.post("/v1/tenants", json={"name": f"fast-{uuid.uuid4().hex[:6]}"}).json()
        reader = admin.post("/v1/tokens", json={"tenant": created["id"], "name": "dash",
                                                "scopes": ["read"]}).json()["token"]
    with queue_server.client(created["token"]) as owner:
        job_id = owner.post("/v1/jobs", json=tiny_spec()).json()["id"]

    def reads_counted() -> float:
        text = httpx.get(f"{queue_server.url}/metrics").text
        return sum(float(v) for v in re.findall(
            r'^trainyard_http_request_duration_seconds_count\{[^}]*method="GET"[^}]*route="/v1/jobs/\{job_id\}"'
            r'[^}]*status="200"[^}]*\} (\S+)$', text, re.M))

    before = reads_counted()
    with queue_server.client(reader) as dash:
        full, fast = dash.get(f"/v1/jobs/{job_id}"), dash.get(f"/v1/jobs/{job_id}")
        assert dash.get("/v1/jobs/not-a-job").status_code == 404  # and the fast path's misses still 404
    assert full.status_code == fast.status_code == 200
    assert fast.content == full.content and json.loads(fast.content)["id"] == job_id
    assert {k: fast.headers[k] for k in ("content-type", "content-length")} == \
           {k: full.headers[k] for k in ("content-type", "content-length")}
    assert reads_counted() - before == 2
