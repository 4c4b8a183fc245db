"""Tenants, scoped tokens, quotas at submit, spec gates and the audit log, over real HTTP (scheduler
paused) on SQLite and PostgreSQL; the token commands through the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import httpx

from tests.api.test_bad_input import _fails
from tests.helpers import tiny_spec
from tests.live import ADMIN_TOKEN

USER_CODE = {"model": {"entrypoint": "tests.fixtures.user_code:make_model"},
             "data": {"entrypoint": "tests.fixtures.user_code:make_dataset"}, "train.loss": "mse"}


def new_tenant(server, **quotas) -> tuple[dict, str]:
    with server.client() as admin:
        resp = admin.post("/v1/tenants", json={"name": f"t-{uuid.uuid4().hex[:8]}", **quotas})
    assert resp.status_code == 201, resp.text
    body = resp.json()
    return body, body.pop("token")


def new_token(server, tenant: str, scopes: list[str], **extra) -> tuple[dict, str]:
    with server.client() as admin:
        resp = admin.post("/v1/tokens", json={"tenant": tenant, "name": "test", "scopes": scopes, **extra})
    assert resp.status_code == 201, resp.text
    body = resp.json()
    return body, body["token"]


# --- the scope matrix -------------------------------------------------------

# Every /v1 route and the scope it needs. The test below fails if the app has a route this table lacks.
ROUTES = {
    ("GET", "/v1/jobs"): "read", ("GET", "/v1/jobs/{job_id}"): "read",
    ("GET", "/v1/jobs/{job_id}/events"): "read", ("GET", "/v1/jobs/{job_id}/metrics"): "read",
    ("GET", "/v1/jobs/{job_id}/logs"): "read", ("GET", "/v1/jobs/{job_id}/checkpoints"): "read",
    ("GET", "/v1/jobs/{job_id}/checkpoints/model"): "read", ("POST", "/v1/plans"): "read",
    ("POST", "/v1/jobs"): "submit", ("POST", "/v1/jobs/{job_id}/cancel"): "submit", ("POST", "/v1/code"): "submit",
    ("POST", "/v1/tenants"): "admin", ("GET", "/v1/tenants"): "admin", ("GET", "/v1/tenants/{tenant_id}"): "admin",
    ("PATCH", "/v1/tenants/{tenant_id}"): "admin", ("POST", "/v1/tokens"): "admin", ("GET", "/v1/tokens"): "admin",
    ("DELETE", "/v1/tokens/{token_id}"): "admin", ("GET", "/v1/audit"): "admin",
    ("GET", "/v1/queue"): "read", ("GET", "/v1/cluster"): "read",
}


def test_every_route_checks_its_scope(queue_server, counts):
    schema = httpx.get(f"{queue_server.url}/openapi.json").json()
    routes = {(m.upper(), p) for p, ops in schema["paths"].items() for m in ops if p.startswith("/v1/")}
    assert routes == set(ROUTES), f"routes without a scope in this test: {routes ^ set(ROUTES)}"
    tenant, submit_token = new_tenant(queue_server)
    with queue_server.client(submit_token) as owner:
        job = owner.post("/v1/jobs", json=tiny_spec()).json()
    tokens = {scope: new_token(queue_server, tenant["id"], [scope])[1] for scope in ("read", "submit", "admin")}
    ids = {"job_id": job["id"], "tenant_id": "no-such-tenant", "token_id": "999999"}
    before = counts()
    for (method, path), needed in ROUTES.items():
        url = path.format(**ids)
        body = tiny_spec() if path in ("/v1/jobs", "/v1/plans") else {"bogus": 1} if method in ("POST", "PATCH") else None
        for scope, token in tokens.items():
            with queue_server.client(token) as client:
                resp = client.request(method, url, json=body)
            if scope == needed:
                assert resp.status_code not in (401, 403), f"{method} {path} with {scope}: {resp.text}"
            else:
                _fails(resp, 403, f"needs the '{needed}' scope", f"['{scope}']")
    after = counts()
    # Only the calls with the right scope changed anything: one job submitted (and the first one cancelled).
    assert after["jobs"] == before["jobs"] + 1 and after["tenants"] == before["tenants"]
    with queue_server.client(tokens["read"]) as reader:
        assert reader.get(f"/v1/jobs/{job['id']}").json()["state"] == "CANCELLED"


def test_admin_scope_does_not_open_another_tenants_jobs(queue_server, tenant):
    job = tenant.post("/v1/jobs", json=tiny_spec()).json()
    other, _ = new_tenant(queue_server)
    _, all_scopes = new_token(queue_server, other["id"], ["read", "submit", "admin"])
    with queue_server.client(all_scopes) as intruder:
        for method, suffix in [("GET", ""), ("POST", "/cancel"), ("GET", "/events"), ("GET", "/metrics"),
                               ("GET", "/logs"), ("GET", "/checkpoints"), ("GET", "/checkpoints/model")]:
            _fails(intruder.request(method, f"/v1/jobs/{job['id']}{suffix}"), 404, "not found")
        assert job["id"] not in [j["id"] for j in intruder.get("/v1/jobs").json()["jobs"]]


# --- tokens: create, list, revoke, expire -----------------------------------

def test_token_shown_once_listed_without_secret_and_revoked_at_once(queue_server, counts):
    tenant, _ = new_tenant(queue_server)
    row, secret = new_token(queue_server, tenant["name"], ["read"])
    assert secret.startswith("ty_") and row["scopes"] == ["read"] and row["active"]
    with queue_server.client(secret) as client:
        assert client.get("/v1/jobs").status_code == 200
        with queue_server.client() as admin:
            listed = admin.get("/v1/tokens", params={"tenant": tenant["id"]}).json()["tokens"]
            assert {t["id"] for t in listed} >= {row["id"]}
            assert all("token" not in t and secret not in str(t) for t in listed)
            revoked = admin.delete(f"/v1/tokens/{row['id']}")
            assert revoked.status_code == 200 and revoked.json()["revoked_at"] and not revoked.json()["active"]
        _fails(client.get("/v1/jobs"), 401, "unknown or revoked token")  # at once: this replica forgot it
    with queue_server.client() as admin:
        _fails(admin.delete("/v1/tokens/987654"), 404, "not found")
        before = counts()
        _fails(admin.post("/v1/tokens", json={"tenant": tenant["id"], "name": "x", "scopes": ["root"]}), 422, "scopes")
        _fails(admin.post("/v1/tokens", json={"tenant": tenant["id"], "name": "x", "scopes": []}), 422, "scopes")
        _fails(admin.post("/v1/tokens", json={"tenant": "nobody", "name": "x", "scopes": ["read"]}), 404, "nobody")
        _fails(admin.post("/v1/tokens", json={"tenant": tenant["id"], "name": "x", "scopes": ["read"],
                                              "expires_at": "2001-01-01T00:00:00Z"}), 422, "expires_at", "future")
        _fails(admin.post("/v1/tokens", json={"tenant": tenant["id"], "name": "x", "scopes": ["read"],
                                              "ttl_s": 5, "expires_at": "2999-01-01T00:00:00Z"}), 422, "at most one")
        assert counts() == before


def test_token_expires(queue_server):
    tenant, _ = new_tenant(queue_server)
    row, secret = new_token(queue_server, tenant["id"], ["read"], ttl_s=2)
    assert row["expires_at"]
    with queue_server.client(secret) as client:
        assert client.get("/v1/jobs").status_code == 200  # cached now: expiry must still cut it off
        time.sleep(2.5)
        _fails(client.get("/v1/jobs"), 401, "expired")
    with queue_server.client() as admin:
        listed = {t["id"]: t for t in admin.get("/v1/tokens", params={"tenant": tenant["id"]}).json()["tokens"]}
        assert listed[row["id"]]["active"] is False and listed[row["id"]]["revoked_at"] is None


def test_expiry_with_a_time_zone_is_kept_as_the_same_instant(queue_server):
    from datetime import datetime, timedelta, timezone

    tenant, _ = new_tenant(queue_server)
    when = (datetime.now(timezone(timedelta(hours=5))) + timedelta(hours=1)).replace(microsecond=0)
    row, secret = new_token(queue_server, tenant["id"], ["read"], expires_at=when.isoformat())
    assert datetime.fromisoformat(row["expires_at"]) == when
    with queue_server.client() as admin:
        listed = {t["id"]: t for t in admin.get("/v1/tokens", params={"tenant": tenant["id"]}).json()["tokens"]}
        assert datetime.fromisoformat(listed[row["id"]]["expires_at"]) == when and listed[row["id"]]["active"]
        _fails(admin.post("/v1/tokens", json={"tenant": tenant["id"], "name": "x", "scopes": ["read"],
                                              "expires_at": "9999-12-31T23:59:59-05:00"}), 422, "10 years")
        _fails(admin.delete(f"/v1/tokens/{2**40}"), 422, "token_id")
        me = next(t for t in admin.get("/v1/tokens").json()["tokens"] if t["name"] == "bootstrap admin")
        _fails(admin.delete(f"/v1/tokens/{me['id']}"), 409, "the one this request uses")
        assert admin.get("/v1/tokens").status_code == 200  # still in
    with queue_server.client(secret) as client:
        assert client.get("/v1/jobs").status_code == 200


def test_tenants_listed_read_and_patched(queue_server, counts):
    tenant, _ = new_tenant(queue_server, max_workers=4, max_queued_jobs=3, quota_mode="queue")
    with queue_server.client() as admin:
        listed = {t["id"]: t for t in admin.get("/v1/tenants").json()["tenants"]}
        assert listed[tenant["id"]]["max_workers"] == 4 and listed[tenant["id"]]["quota_mode"] == "queue"
        patched = admin.patch(f"/v1/tenants/{tenant['name']}", json={"max_workers": None, "allow_user_code": True})
        assert patched.status_code == 200, patched.text
        got = admin.get(f"/v1/tenants/{tenant['id']}").json()
        assert got["max_workers"] is None and got["max_queued_jobs"] == 3 and got["allow_user_code"] is True
        assert got["usage"] == {"queued_jobs": 0, "running_workers": 0, "queued_workers": 0}
        before = counts()
        _fails(admin.patch(f"/v1/tenants/{tenant['id']}", json={"quota_mode": "sometimes"}), 422, "quota_mode")
        _fails(admin.patch(f"/v1/tenants/{tenant['id']}", json={"max_workers": 0}), 422, "max_workers")
        _fails(admin.patch("/v1/tenants/nobody", json={"max_workers": 1}), 404, "nobody")
        _fails(admin.post("/v1/tenants", json={"name": tenant["name"]}), 409, "already exists")
        assert counts() == before
        assert admin.get(f"/v1/tenants/{tenant['id']}").json()["max_queued_jobs"] == 3


# --- quotas at submit ---------------------------------------------------------

def test_max_queued_jobs_is_429(queue_server, counts):
    tenant, token = new_tenant(queue_server, max_queued_jobs=2)
    with queue_server.client(token) as client:
        jobs = [client.post("/v1/jobs", json=tiny_spec()).json() for _ in range(2)]
        before = counts()
        over = client.post("/v1/jobs", json=tiny_spec())
        _fails(over, 429, "max_queued_jobs", tenant["name"])
        assert over.headers["retry-after"] and counts() == before
        client.post(f"/v1/jobs/{jobs[0]['id']}/cancel")
        assert client.post("/v1/jobs", json=tiny_spec()).status_code == 201


def test_max_workers_reject_mode_counts_queued_workers(queue_server, counts):
    tenant, token = new_tenant(queue_server, max_workers=3, quota_mode="reject")
    two = tiny_spec(**{"resources.workers": 2, "parallel.dp": 2})
    with queue_server.client(token) as client:
        assert client.post("/v1/jobs", json=two).status_code == 201
        assert client.post("/v1/jobs", json=tiny_spec()).status_code == 201
        before = counts()
        _fails(client.post("/v1/jobs", json=tiny_spec()), 429, "max_workers quota of 3", "quota_mode reject")
        _fails(client.post("/v1/jobs", json=tiny_spec(**{"resources.workers": 4, "parallel.dp": 4})), 422,
               "resources.workers", "at most 3")
        assert counts() == before
        with queue_server.client() as admin:  # the admin lifts the quota: the same submit now goes in
            admin.patch(f"/v1/tenants/{tenant['id']}", json={"max_workers": 4})
        assert client.post("/v1/jobs", json=tiny_spec()).status_code == 201


def test_max_workers_queue_mode_accepts_and_waits(queue_server):
    tenant, token = new_tenant(queue_server, max_workers=1, quota_mode="queue")
    with queue_server.client(token) as client:
        assert all(client.post("/v1/jobs", json=tiny_spec()).status_code == 201 for _ in range(3))
        _fails(client.post("/v1/jobs", json=tiny_spec(**{"resources.workers": 2, "parallel.dp": 2})), 422,
               "resources.workers", "at most 1")
    with queue_server.client() as admin:
        assert admin.get(f"/v1/tenants/{tenant['id']}").json()["usage"]["queued_workers"] == 3


# --- what a spec may ask for -----------------------------------------------------

def test_user_code_only_for_allowed_tenants(queue_server, counts):
    tenant, token = new_tenant(queue_server)
    with queue_server.client(token) as client:
        before = counts()
        _fails(client.post("/v1/jobs", json=tiny_spec(**USER_CODE)), 403, "model.entrypoint", "allow_user_code")
        data_only = tiny_spec(**{"data": {"entrypoint": "tests.fixtures.user_code:make_dataset"},
                                 "model": {"name": "mlp", "in_features": 4}, "train.loss": "mse"})
        _fails(client.post("/v1/jobs", json=data_only), 403, "data.entrypoint")
        assert counts() == before
        with queue_server.client() as admin:
            admin.patch(f"/v1/tenants/{tenant['id']}", json={"allow_user_code": True})
        resp = client.post("/v1/jobs", json=tiny_spec(**USER_CODE))
        assert resp.status_code == 201, resp.text


def test_fault_injection_needs_an_admin_scoped_token(queue_server, counts):
    tenant, token = new_tenant(queue_server)  # the server allows fault injection (tests.live.Server)
    faulty = tiny_spec(fault_injection=[{"at_step": 3, "kind": "crash"}])
    with queue_server.client(token) as client:
        before = counts()
        _fails(client.post("/v1/jobs", json=faulty), 403, "fault_injection", "admin scope")
        assert counts() == before
    _, admin_scoped = new_token(queue_server, tenant["id"], ["submit", "admin"])
    with queue_server.client(admin_scoped) as client:
        resp = client.post("/v1/jobs", json=faulty)
        assert resp.status_code == 201 and resp.json()["spec"]["fault_injection"][0]["kind"] == "crash"


def test_storage_paths_stay_under_the_storage_root(queue_server, tenant, counts):
    root = (queue_server.home / "storage").resolve()
    own = tenant.post("/v1/jobs", json=tiny_spec()).json()
    _, other_token = new_tenant(queue_server)
    with queue_server.client(other_token) as other:
        foreign = other.post("/v1/jobs", json=tiny_spec()).json()
    (root / "escape").parent.mkdir(parents=True, exist_ok=True)
    if not (root / "escape").exists():
        os.symlink("/etc", root / "escape")
    before = counts()
    for path, needles in [
        ("../outside/model.safetensors", ["train.init_from", "'..'"]),
        ("jobs/x/../../../etc/passwd", ["train.init_from", "'..'"]),
        ("/etc/passwd", ["train.init_from", "under the storage root"]),
        ("escape/passwd", ["train.init_from", "under the storage root"]),  # a symlink out of the root
        (f"jobs/{foreign['id']}/model.safetensors", ["train.init_from", "not one of this tenant's jobs"]),
        (str(root / "jobs" / foreign["id"]), ["train.init_from", "not one of this tenant's jobs"]),
    ]:
        _fails(tenant.post("/v1/jobs", json=tiny_spec(**{"train.init_from": path})), 422, *needles)
    assert counts() == before
    accepted = tenant.post("/v1/jobs", json=tiny_spec(**{"train.init_from": f"jobs/{own['id']}/model.safetensors"}))
    assert accepted.status_code == 201, accepted.text
    assert accepted.json()["spec"]["train"]["init_from"] == str(root / "jobs" / own["id"] / "model.safetensors")


# --- the audit log ----------------------------------------------------------------

def test_state_changing_calls_are_audited(queue_server):
    tenant, token = new_tenant(queue_server, max_queued_jobs=1)
    row, reader = new_token(queue_server, tenant["id"], ["read"])
    with queue_server.client(token) as client:
        job = client.post("/v1/jobs", json=tiny_spec(), headers={"Idempotency-Key": "audit-1"}).json()
        replay = client.post("/v1/jobs", json=tiny_spec(), headers={"Idempotency-Key": "audit-1"})
        assert replay.headers["Idempotent-Replayed"] == "true"  # audited too, once, like any call
        assert client.post("/v1/jobs", json=tiny_spec()).status_code == 429
        with queue_server.client(reader) as read_only:
            assert read_only.post(f"/v1/jobs/{job['id']}/cancel").status_code == 403
        client.post(f"/v1/jobs/{job['id']}/cancel")
        assert client.get("/v1/jobs").status_code == 200  # reads are not audited
        _fails(client.get("/v1/audit"), 403, "admin")
    with queue_server.client() as admin:
        admin.patch(f"/v1/tenants/{tenant['id']}", json={"max_queued_jobs": 5})
        admin.delete(f"/v1/tokens/{row['id']}")
        records = admin.get("/v1/audit", params={"tenant": tenant["name"]}).json()["records"]
    seen = [(r["action"], r["target"], r["status"], r["outcome"]) for r in records]
    assert seen == [
        ("tenant.create", tenant["id"], 201, "ok"),
        ("token.create", str(row["id"]), 201, "ok"),
        ("job.submit", job["id"], 201, "ok"),
        ("job.submit", job["id"], 201, "ok"),
        ("job.submit", None, 429, "rejected"),
        ("job.cancel", job["id"], 403, "denied"),
        ("job.cancel", job["id"], 202, "ok"),
        ("tenant.update", tenant["id"], 200, "ok"),
        ("token.revoke", str(row["id"]), 200, "ok"),
    ], seen
    by_tenant = [r for r in records if r["action"].startswith("job.")]
    assert {(r["tenant_id"], r["token_name"]) for r in by_tenant} == {(tenant["id"], "default"), (tenant["id"], "test")}
    assert records[5]["token_id"] == row["id"] and "needs the 'submit' scope" in records[5]["detail"]
    assert "max_queued_jobs" in records[4]["detail"] and records[0]["token_name"] == "bootstrap admin"
    assert all(r["ts"].endswith("+00:00") for r in records)


# --- the CLI ------------------------------------------------------------------

def cli(server, *args: str, token: str = ADMIN_TOKEN) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TRAINYARD_TOKEN", "TRAINYARD_ADMIN_TOKEN")}
    env |= {"TRAINYARD_URL": server.url, "TRAINYARD_TOKEN": token, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "api.cli", *args], env=env, capture_output=True, text=True, timeout=60)


def test_cli_tenant_and_token_commands(queue_server):
    name = f"cli-{uuid.uuid4().hex[:6]}"
    made = cli(queue_server, "tenant-create", name, "--max-workers", "2", "--quota-mode", "queue", "--weight", "2.5")
    assert made.returncode == 0 and "token: ty_" in made.stdout, made.stderr
    updated = cli(queue_server, "tenant-update", name, "--reserve-after-s", "45")
    assert updated.returncode == 0 and json.loads(updated.stdout)["reserve_after_s"] == 45, updated.stderr
    listed = cli(queue_server, "tenant-list")
    row = next(line for line in listed.stdout.splitlines() if name in line)
    assert listed.returncode == 0 and "queue" in row and "2.5" in row and "45s" in row, listed.stdout
    bad = cli(queue_server, "tenant-update", name, "--weight", "0")
    assert bad.returncode != 0 and "weight" in bad.stderr, bad.stderr
    created = cli(queue_server, "token-create", name, "--name", "ci", "--scope", "read", "--scope", "submit", "--ttl", "600")
    assert created.returncode == 0, created.stderr
    secret = created.stdout.strip().splitlines()[-1]
    token_id = created.stdout.split()[1]
    assert secret.startswith("ty_") and "read,submit" in created.stdout and "expires" in created.stdout
    assert cli(queue_server, "list", token=secret).returncode == 0  # the new token works
    tokens = cli(queue_server, "token-list", "--tenant", name)
    assert tokens.returncode == 0 and "ci" in tokens.stdout and "active" in tokens.stdout and secret not in tokens.stdout
    revoked = cli(queue_server, "token-revoke", token_id)
    assert revoked.returncode == 0 and "revoked" in revoked.stdout
    refused = cli(queue_server, "list", token=secret)
    assert refused.returncode == 1 and "401" in refused.stderr and "revoked" in refused.stderr
    assert "revoked" in cli(queue_server, "token-list", "--tenant", name).stdout
    forbidden = cli(queue_server, "token-list", token=made.stdout.split("token: ")[1].strip())
    assert forbidden.returncode == 1 and "403" in forbidden.stderr and "admin" in forbidden.stderr
