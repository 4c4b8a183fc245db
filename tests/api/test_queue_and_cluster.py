"""GET /v1/queue and GET /v1/cluster over real HTTP on a live service and the session's Ray: a big job
that fits the cluster but not what is free, past its tenant's reserve_after_s, shows its reservation
(a tenant sees its own queue only, an admin every tenant's); the cluster lists the local Ray's
nodes with what each has and has free; both refuse a request without a token."""

from __future__ import annotations

import time
import uuid
from datetime import datetime

import httpx
import pytest
import ray
from ray.util.placement_group import placement_group, remove_placement_group

from tests.helpers import tiny_spec
from tests.live import TERMINAL, Server, wait_for


@pytest.fixture
def server(tmp_path, ray_address, live_db_url):
    srv = Server(tmp_path / "home", live_db_url, ray_address, TRAINYARD_STANDBY_SUPERVISORS="0").start()
    yield srv
    srv.stop()


def new_tenant(server, **fields) -> dict:
    with server.client() as admin:
        resp = admin.post("/v1/tenants", json={"name": f"q-{uuid.uuid4().hex[:6]}", **fields})
    assert resp.status_code == 201, resp.text
    return resp.json()


def reservation_of(client: httpx.Client, tenant: str, timeout: float = 20.0) -> tuple[dict, dict]:
    """GET /v1/queue until `tenant` shows a reservation: (the answer, the tenant's entry)."""
    deadline = time.monotonic() + timeout
    while True:
        resp = client.get("/v1/queue")
        assert resp.status_code == 200, resp.text
        entry = next(t for t in resp.json()["tenants"] if t["tenant"] == tenant)
        if entry["reservation"] is not None or time.monotonic() > deadline:
            return resp.json(), entry
        time.sleep(0.2)


def test_a_big_job_past_reserve_after_s_shows_its_reservation_in_the_queue(server, ray_cluster):
    free = ray.available_resources()["CPU"]
    holder = placement_group([{"CPU": free - 1}])  # all but one CPU taken: a 2-CPU job fits later, not now
    ray.get(holder.ready(), timeout=30)
    try:
        big_tenant, other = new_tenant(server, reserve_after_s=0), new_tenant(server)
        with server.client(big_tenant["token"]) as c:
            big = c.post("/v1/jobs", json=tiny_spec(**{"resources.cpus_per_worker": 2.0})).json()
            answer, mine = reservation_of(c, big_tenant["name"])
            assert [t["tenant"] for t in answer["tenants"]] == [big_tenant["name"]]  # its own tenant only
            assert mine["reservation"] is not None, answer
            assert (mine["reservation"]["job"], mine["reservation"]["workers"]) == (big["id"], 1)
            assert datetime.fromisoformat(mine["reservation"]["since"]) >= datetime.fromisoformat(big["created_at"])
            assert (mine["queued"], mine["running_workers"], mine["weight"], mine["fair_share"]) == (1, 0, 1.0, 0.0)
            assert answer["reserve_after_s"] == 300.0  # the server's; the tenant's own is 0
            assert c.get(f"/v1/jobs/{big['id']}").json()["state"] == "QUEUED"
        with server.client(other["token"]) as o:
            [theirs] = o.get("/v1/queue").json()["tenants"]
            assert theirs == {"tenant": other["name"], "weight": 1.0, "fair_share": 0.0, "running_workers": 0,
                              "queued": 0, "reservation": None}
        with server.client() as admin:
            listed = {t["tenant"]: t for t in admin.get("/v1/queue").json()["tenants"]}
            assert {big_tenant["name"], other["name"], "admin"} <= set(listed)
            assert listed[big_tenant["name"]]["reservation"]["job"] == big["id"]
        with server.client(big_tenant["token"]) as c:
            c.post(f"/v1/jobs/{big['id']}/cancel")
            wait_for(c, big["id"], TERMINAL, timeout=30)
    finally:
        remove_placement_group(holder)


def test_the_cluster_lists_the_local_rays_nodes_and_both_paths_need_a_token(server, ray_cluster):
    for path in ("/v1/queue", "/v1/cluster"):
        resp = httpx.get(f"{server.url}{path}", timeout=30)
        assert resp.status_code == 401 and "missing bearer token" in resp.json()["detail"], (path, resp.text)
    tenant = new_tenant(server)
    with server.client(tenant["token"]) as c:
        resp = c.get("/v1/cluster")
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    alive = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    listed = {n["node"]: n for n in answer["nodes"]}
    assert alive and alive <= set(listed)
    for node_id in alive:
        node = listed[node_id]
        assert node["alive"] and node["total"]["CPU"] > 0 and 0 <= node["free"]["CPU"] <= node["total"]["CPU"]
    assert answer["total"]["CPU"] == sum(listed[n]["total"]["CPU"] for n in alive)
    assert 0 <= answer["free"]["CPU"] <= answer["total"]["CPU"]
