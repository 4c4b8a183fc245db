"""Two `trainyard serve` replicas on one PostgreSQL and one Ray: the leader is SIGKILLed mid-run,
the other takes the lease over, re-attaches to the live supervisors and finishes every job, each
admitted once and run by one supervisor, nothing stored twice."""

from __future__ import annotations

import time
from collections import Counter

import httpx
import pytest
from sqlalchemy import select

from tests.helpers import tiny_spec
from tests.live import (
    TERMINAL,
    Server,
    create_pg_schema,
    drop_pg_schema,
    pg_schema_url,
    states_of,
    wait_for,
)

pytestmark = pytest.mark.slow
LEASE_TTL_S = 3
JOBS = 3
# long enough that a job that started warm is still running when the last one starts
# (300 was not, once the ranks ran at nice 0)
STEPS = 1000


@pytest.fixture
def replicas(tmp_path, ray_address):
    schema = create_pg_schema()
    url = pg_schema_url(schema)
    shared = {"TRAINYARD_LEASE_TTL_S": str(LEASE_TTL_S), "TRAINYARD_STORAGE_URI": str(tmp_path / "storage")}
    pair = [Server(tmp_path / f"home-{i}", url, ray_address, **shared) for i in range(2)]
    try:
        for server in pair:
            server.start()
        yield url, pair, tmp_path / "storage"
    finally:
        for server in pair:
            server.stop()
        drop_pg_schema(schema)


def _lease(url: str) -> tuple[str, int]:
    from service.db.engine import make_engine, make_sessionmaker
    from service.db.models import LeaseRow

    engine = make_engine(url)
    try:
        with make_sessionmaker(engine)() as s:
            row = s.scalar(select(LeaseRow))
            return row.holder, row.token
    finally:
        engine.dispose()


def _leader(url: str, pair: list[Server]) -> Server:
    holder, _ = _lease(url)
    pid = int(holder.split(":")[1])
    return next(server for server in pair if server.proc.pid == pid)


@pytest.mark.exhaustive  # make test: the soak SIGKILLs the leader and asserts nothing lost or duplicated (test_soak)
def test_killing_the_leader_loses_and_duplicates_nothing(replicas):
    url, pair, storage = replicas
    leader = _leader(url, pair)
    follower = next(server for server in pair if server is not leader)
    _, token_before = _lease(url)
    spec = tiny_spec(**{"resources.workers": 2, "train.steps": STEPS, "checkpoint.every_steps": 100})
    ids = []
    for i in range(JOBS):  # submitted across both replicas
        with pair[i % 2].client() as c:
            resp = c.post("/v1/jobs", json={**spec, "name": f"ha-{i}"}, headers={"Idempotency-Key": f"ha-{i}"})
            assert resp.status_code == 201, resp.text
            ids.append(resp.json()["id"])
    with follower.client() as c:  # the follower reads what the leader writes
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            jobs = [c.get(f"/v1/jobs/{i}").json() for i in ids]
            if sum(j["state"] == "RUNNING" and j["step"] >= 5 for j in jobs) >= 2:
                break
            time.sleep(0.3)
        assert sum(j["state"] == "RUNNING" for j in jobs) >= 2, jobs
        assert all(j["state"] not in TERMINAL for j in jobs), jobs  # killed mid-flight
    leader.kill()  # SIGKILL: no clean-up, the lease is left to expire

    with follower.client() as c:
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{leader.url}/healthz", timeout=2)
        done = [wait_for(c, i, TERMINAL, timeout=300) for i in ids]
        holder, token = _lease(url)
        assert int(holder.split(":")[1]) == follower.proc.pid and token == token_before + 1
        for job in done:
            assert job["state"] == "SUCCEEDED" and job["step"] == STEPS and job["restarts"] == 0, job
            events = c.get(f"/v1/jobs/{job['id']}/events").json()["events"]
            _assert_once(c, job, events, storage)
        assert any("reattach" in [e["kind"] for e in c.get(f"/v1/jobs/{i}/events").json()["events"]] for i in ids)
        listed = c.get("/v1/jobs", params={"limit": 1000}).json()["jobs"]
        assert sorted(j["id"] for j in listed if j["name"].startswith("ha-")) == sorted(ids)  # none lost, none doubled


def _assert_once(c: httpx.Client, job: dict, events: list[dict], storage) -> None:
    """One admission, each transition once, each checkpoint once, each step once, one supervisor."""
    admissions = [e for e in events if e["kind"] == "state" and e["state"] == "STARTING"]
    assert len(admissions) == 1, admissions
    assert states_of(events) == ["QUEUED", "STARTING", "RUNNING", "SUCCEEDED"], states_of(events)
    transitions = Counter((e["data"].get("from"), e["state"]) for e in events if e["kind"] == "state")
    assert max(transitions.values()) == 1, transitions
    checkpoints = Counter(e["data"]["step"] for e in events if e["kind"] == "checkpoint")
    assert checkpoints and max(checkpoints.values()) == 1, checkpoints
    steps = [p["step"] for p in c.get(f"/v1/jobs/{job['id']}/metrics").json()["points"]]
    assert steps == list(range(1, STEPS + 1)), steps[:5]
    assert not [e for e in events if e["kind"] in ("ignored_transition", "restart")], events
    # Every supervisor that takes the job logs its way to RUNNING once: exactly one ran it (epoch 1).
    log = (storage / "jobs" / job["id"] / "logs" / "supervisor.log").read_text()
    assert log.count("state RUNNING") == 1, log[-2000:]



def test_a_second_replica_on_one_sqlite_file_is_refused(tmp_path, ray_address):
    url = f"sqlite:///{tmp_path}/ty.db"
    first = Server(tmp_path / "home-0", url, ray_address, TRAINYARD_WARM_WORKERS="0", TRAINYARD_LEASE_TTL_S="2").start()
    second = Server(tmp_path / "home-1", url, ray_address, TRAINYARD_WARM_WORKERS="0", TRAINYARD_LEASE_TTL_S="2")
    try:
        with pytest.raises(RuntimeError, match="SQLite supports one control-plane replica"):
            second.start()
        with first.client() as c:  # the first one is untouched
            assert c.get("/v1/jobs").status_code == 200
    finally:
        second.stop()
        first.stop()
