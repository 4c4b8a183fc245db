"""GET /v1/jobs?tenant=: an admin lists any tenant's jobs (the console's tenant filter); another token may
name only its own tenant (any other is a 403 naming `tenant`); an unknown tenant is a 404 naming it; the
listing stays newest first, paginated and on the (tenant_id, created_at) index."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import event

from service.db import repository as repo
from tests.api.test_bad_input import _fails
from tests.helpers import spec_of


def _tenant(client) -> tuple[dict, str]:
    resp = client.post("/v1/tenants", json={"name": f"t-{uuid.uuid4().hex[:8]}"})
    assert resp.status_code == 201, resp.text
    body = resp.json()
    return body, body.pop("token")


def _token(client, tenant: str, scopes: list[str]) -> str:
    resp = client.post("/v1/tokens", json={"tenant": tenant, "name": "test", "scopes": scopes})
    assert resp.status_code == 201, resp.text
    return resp.json()["token"]


def _jobs(client, tenant_id: str, names: list[str]) -> list[str]:
    """Jobs stored for the tenant, oldest first (this app runs no scheduler: they stay QUEUED)."""
    plane = client.app.state.plane
    ids = []
    for name in names:
        with plane.sessions.begin() as s:
            ids.append(repo.create_job(s, tenant_id, spec_of(name=name), 0, "sha", None, None).id)
    return ids


def _as(client, token: str) -> dict:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def two_tenants(client):
    (a, a_token), (b, b_token) = _tenant(client), _tenant(client)
    return {"a": a, "a_token": a_token, "a_jobs": _jobs(client, a["id"], ["a0", "a1", "a2"]),
            "b": b, "b_token": b_token, "b_jobs": _jobs(client, b["id"], ["b0"])}


def test_an_admin_lists_any_tenants_jobs_by_id_or_name_paginated(client, two_tenants):
    a = two_tenants["a"]
    listed = client.get("/v1/jobs", params={"tenant": a["id"]}).json()
    assert [j["id"] for j in listed["jobs"]] == two_tenants["a_jobs"][::-1]  # newest first
    assert listed["tenant"] == a["id"]
    assert [j["id"] for j in client.get("/v1/jobs", params={"tenant": a["name"]}).json()["jobs"]] == \
        two_tenants["a_jobs"][::-1]
    page = client.get("/v1/jobs", params={"tenant": a["id"], "limit": 2, "offset": 1}).json()
    assert [j["id"] for j in page["jobs"]] == two_tenants["a_jobs"][1::-1] and page["limit"] == 2
    assert client.get("/v1/jobs", params={"tenant": a["id"], "state": "RUNNING"}).json()["jobs"] == []
    # Without ?tenant= the admin's own tenant, as before.
    own = {j["id"] for j in client.get("/v1/jobs").json()["jobs"]}
    assert not own & set(two_tenants["a_jobs"] + two_tenants["b_jobs"])
    # An admin-scoped token of another tenant (not the bootstrap one) may too; it also needs `read` to list.
    admin_of_b = _token(client, two_tenants["b"]["id"], ["read", "admin"])
    listed = client.get("/v1/jobs", params={"tenant": a["id"]}, headers=_as(client, admin_of_b)).json()
    assert len(listed["jobs"]) == 3


def test_another_tenants_jobs_are_a_403_naming_tenant_for_a_token_without_admin(client, two_tenants):
    a, b = two_tenants["a"], two_tenants["b"]
    headers = _as(client, two_tenants["a_token"])
    # Its own tenant, by id or name: allowed, the same list as without ?tenant=.
    plain = client.get("/v1/jobs", headers=headers).json()["jobs"]
    for own in (a["id"], a["name"]):
        assert client.get("/v1/jobs", params={"tenant": own}, headers=headers).json()["jobs"] == plain
    # Another tenant, existing or not: the same 403, so a tenant learns nothing of the others.
    for other in (b["id"], b["name"], "no-such-tenant"):
        body = _fails(client.get("/v1/jobs", params={"tenant": other}, headers=headers), 403, "tenant", "admin")
        assert body["errors"][0]["field"] == "tenant"
    # Submit and read scopes do not open it either.
    writer = _token(client, a["id"], ["read", "submit"])
    _fails(client.get("/v1/jobs", params={"tenant": b["id"]}, headers=_as(client, writer)), 403, "tenant")


def test_an_unknown_tenant_is_a_404_naming_tenant(client):
    body = _fails(client.get("/v1/jobs", params={"tenant": "no-such-tenant"}), 404, "tenant", "no-such-tenant")
    assert body["errors"][0]["field"] == "tenant"
    _fails(client.get("/v1/jobs", params={"tenant": ""}), 422, "tenant")
    _fails(client.get("/v1/jobs", params={"tenant": "x" * 65}), 422, "tenant")


def test_the_tenant_listing_reads_the_tenant_created_index(client, two_tenants):
    """The statement the route runs, planned by SQLite: a search of ix_jobs_tenant_created, no table scan."""
    engine = client.app.state.plane.engine
    seen: list[tuple[str, object]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("SELECT") and "FROM jobs" in statement and "LIMIT" in statement:
            seen.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        assert client.get("/v1/jobs", params={"tenant": two_tenants["a"]["id"], "limit": 2}).status_code == 200
    finally:
        event.remove(engine, "before_cursor_execute", capture)
    assert len(seen) == 1, seen
    statement, parameters = seen[0]
    with engine.connect() as conn:
        plan = " | ".join(row[-1] for row in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters))
    assert "SEARCH jobs USING INDEX ix_jobs_tenant_created" in plan and "SCAN jobs" not in plan, plan
