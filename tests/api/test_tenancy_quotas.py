"""Quota `queue` mode on a live service whose scheduler runs real jobs: a tenant never holds more
than max_workers at once, its waiting job does not hold back another tenant's, and its own jobs
start in priority order."""

from __future__ import annotations

import uuid
from datetime import datetime

import pytest

from tests.helpers import tiny_spec
from tests.live import TERMINAL, Server, wait_for

pytestmark = pytest.mark.slow


@pytest.fixture
def server(tmp_path, ray_address):
    srv = Server(tmp_path / "home", f"sqlite:///{tmp_path}/ty.db", ray_address).start()
    yield srv
    srv.stop()


def started(job: dict) -> datetime:
    return datetime.fromisoformat(job["started_at"])


def test_queue_mode_holds_the_tenant_to_max_workers_without_blocking_others(server):
    with server.client() as admin:
        capped = admin.post("/v1/tenants", json={"name": f"q-{uuid.uuid4().hex[:6]}", "max_workers": 2,
                                                 "quota_mode": "queue"}).json()
        other = admin.post("/v1/tenants", json={"name": f"o-{uuid.uuid4().hex[:6]}"}).json()
    two = tiny_spec(**{"resources.workers": 2, "parallel.dp": 2, "train.steps": 150})
    one = tiny_spec(**{"train.steps": 40})
    with server.client(capped["token"]) as c, server.client(other["token"]) as o:
        first = c.post("/v1/jobs", json=two).json()
        wait_for(c, first["id"], {"STARTING", "RUNNING"}, timeout=120)  # it holds the tenant's 2 workers
        low = c.post("/v1/jobs", json=one, params={"priority": 0}).json()
        high = c.post("/v1/jobs", json=one, params={"priority": 5}).json()
        others = o.post("/v1/jobs", json=one).json()  # submitted last, behind the capped tenant's queue
        done = {j["id"]: wait_for(cl, j["id"], TERMINAL, timeout=300)
                for cl, j in ((c, first), (c, low), (c, high), (o, others))}
    assert {j["state"] for j in done.values()} == {"SUCCEEDED"}, done
    first, low, high, others = (done[j["id"]] for j in (first, low, high, others))
    # max_workers=2: the 1-worker jobs wait until the 2-worker job has ended ...
    assert started(high) >= datetime.fromisoformat(first["finished_at"])
    assert started(low) >= datetime.fromisoformat(first["finished_at"])
    # ... and then start by priority, while the other tenant's job, submitted after them, did not wait
    assert started(high) <= started(low)
    assert started(others) < started(high)
    assert started(others) < datetime.fromisoformat(first["finished_at"])  # while the capped tenant was full
    # the two 1-worker jobs may run together (2 workers): the quota is on workers, not on jobs
    with server.client() as admin:
        usage = admin.get(f"/v1/tenants/{capped['id']}").json()["usage"]
    assert usage == {"queued_jobs": 0, "running_workers": 0, "queued_workers": 0}
