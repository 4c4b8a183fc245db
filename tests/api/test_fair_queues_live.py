"""Fair queues on a live service that trains on the session's Ray: a tenant's quota-blocked backlog far
larger than any window does not hold back another tenant's job, and a big job that does not fit lets
small jobs backfill, then gets its reservation (reserve_after_s) and is not overtaken again."""

from __future__ import annotations

import time
import uuid
from datetime import datetime

import pytest
import ray

from tests.helpers import tiny_spec
from tests.live import TERMINAL, Server, wait_for

pytestmark = pytest.mark.slow

BACKLOG = 1_100  # more than the old scheduler's 1,000-job window
LONG = {"train.steps": 100_000}  # runs until cancelled


@pytest.fixture
def server(tmp_path, ray_address, live_db_url):
    srv = Server(tmp_path / "home", live_db_url, ray_address, TRAINYARD_STANDBY_SUPERVISORS="1").start()
    yield srv
    srv.stop()


def new_tenant(server, **fields) -> dict:
    with server.client() as admin:
        resp = admin.post("/v1/tenants", json={"name": f"f-{uuid.uuid4().hex[:6]}", **fields})
    assert resp.status_code == 201, resp.text
    return resp.json()


def started(job: dict) -> datetime:
    return datetime.fromisoformat(job["started_at"])


def events(client, job_id: str) -> list[dict]:
    return client.get(f"/v1/jobs/{job_id}/events").json()["events"]


def test_a_quota_blocked_backlog_beyond_any_window_does_not_hold_back_another_tenant(server, live_db_url):
    capped = new_tenant(server, max_workers=1, quota_mode="queue")
    other = new_tenant(server)
    with server.client(capped["token"]) as c, server.client(other["token"]) as o:
        holder = c.post("/v1/jobs", json=tiny_spec(**LONG)).json()
        wait_for(c, holder["id"], {"STARTING", "RUNNING"}, timeout=60)  # the tenant's one worker is taken
        for _ in range(5):  # over REST, of a higher priority than anything else queued
            assert c.post("/v1/jobs", json=tiny_spec(), params={"priority": 9}).status_code == 201
        submit_backlog(live_db_url, capped["id"], BACKLOG)
        time.sleep(1.0)  # a few scheduler ticks: the backlog is in its queue before the other job comes
        mine = o.post("/v1/jobs", json=tiny_spec(**{"train.steps": 5})).json()
        job = wait_for(o, mine["id"], {"STARTING", "RUNNING", "SUCCEEDED", "FAILED"}, timeout=15)
        waited = (started(job) - datetime.fromisoformat(job["created_at"])).total_seconds()
        assert waited < 5, f"the other tenant's job waited {waited:.1f}s behind a backlog it does not share"
        with server.client() as admin:
            usage = admin.get(f"/v1/tenants/{capped['id']}").json()["usage"]
        assert usage["queued_jobs"] >= BACKLOG  # the backlog still waits on its own quota
        # Leave nothing running on the session's Ray: a job whose server stops under it can start a new
        # attempt as its ranks are killed, and that attempt's placement group outlived it once. The
        # backlog is withdrawn first, so that ending the holder starts none of it.
        withdraw_queued(live_db_url, capped["id"])
        for client, job_id in ((c, holder["id"]), (o, mine["id"])):
            client.post(f"/v1/jobs/{job_id}/cancel")
        for client, job_id in ((c, holder["id"]), (o, mine["id"])):
            wait_for(client, job_id, TERMINAL, timeout=120)


def withdraw_queued(database_url: str, tenant_id: str) -> None:
    """Mark the tenant's queued jobs cancelled-by-request in one statement (the scheduler never admits one)."""
    from sqlalchemy import update

    from service.db.engine import make_engine, make_sessionmaker
    from service.db.models import Job

    engine = make_engine(database_url)
    try:
        with make_sessionmaker(engine).begin() as s:
            queued = (Job.tenant_id == tenant_id) & (Job.state == "QUEUED")
            s.execute(update(Job).where(queued).values(cancel_requested=True))
    finally:
        engine.dispose()


def submit_backlog(database_url: str, tenant_id: str, n: int) -> None:
    """n queued jobs written straight to the service's database, as another replica's submits are
    (1,100 over REST would take minutes on a loaded 2-core host); the scheduler finds them by its
    incremental read, without a wake-up."""
    from service.db import repository as repo
    from service.db.engine import make_engine, make_sessionmaker
    from tests.helpers import spec_of

    engine = make_engine(database_url)
    spec = spec_of()
    try:
        with make_sessionmaker(engine).begin() as s:
            for _ in range(n):
                repo.create_job(s, tenant_id, spec, 9, "sha", None, max_open_jobs=None)
    finally:
        engine.dispose()


def test_a_big_job_lets_small_ones_backfill_then_is_not_overtaken_and_starts(server):
    cpus = ray.cluster_resources().get("CPU", 0.0)
    assert cpus == 8, f"the test needs the session's 8-CPU Ray, found {cpus}"
    small = new_tenant(server)
    big_tenant = new_tenant(server, reserve_after_s=4)  # its own setting; the server's stays 300 s
    whole = {"resources.workers": 2, "parallel.dp": 2, "resources.cpus_per_worker": 4.0, "train.steps": 10}
    with server.client(small["token"]) as s, server.client(big_tenant["token"]) as b:
        filler = s.post("/v1/jobs", json=tiny_spec(**LONG)).json()  # 1 of the 8 CPUs, until cancelled
        wait_for(s, filler["id"], {"STARTING", "RUNNING"}, timeout=60)
        big = b.post("/v1/jobs", json=tiny_spec(**whole)).json()  # all 8 CPUs: does not fit
        early = s.post("/v1/jobs", json=tiny_spec(**{"train.steps": 5})).json()
        early = wait_for(s, early["id"], TERMINAL, timeout=120)  # backfilled past the waiting big job
        assert early["state"] == "SUCCEEDED"
        admitted = [e for e in events(s, early["id"]) if e.get("state") == "STARTING"]
        assert admitted[0]["data"]["backfilled_ahead_of"] == big["id"]
        # After reserve_after_s the free CPUs are held for the big job: a small job that fits waits.
        wait_until_reserved(b, big["id"])
        late = s.post("/v1/jobs", json=tiny_spec(**{"train.steps": 5})).json()
        assert not any(wait_for_any(s, late["id"], {"STARTING", "RUNNING"}, 3.0)), "a small job overtook it"
        s.post(f"/v1/jobs/{filler['id']}/cancel")  # the last CPU frees up: the big job starts
        big = wait_for(b, big["id"], TERMINAL, timeout=180)
        late = wait_for(s, late["id"], TERMINAL, timeout=180)
    assert (big["state"], late["state"]) == ("SUCCEEDED", "SUCCEEDED"), (big, late)
    assert started(early) < started(big) <= started(late)


def wait_until_reserved(client, job_id: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(e["kind"] == "reserved" for e in events(client, job_id)):
            return
        time.sleep(0.2)
    raise AssertionError(f"no reservation for {job_id} in {timeout}s: {events(client, job_id)}")


def wait_for_any(client, job_id: str, states: set[str], seconds: float):
    """Each state the job was seen in over `seconds` that is in `states` (empty: never)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        state = client.get(f"/v1/jobs/{job_id}").json()["state"]
        if state in states:
            yield state
        time.sleep(0.2)
