"""Killing the control plane mid-run loses nothing: it re-attaches to live supervisors and
restarts lost ones from their latest checkpoint; no event or metric is stored twice."""

from __future__ import annotations

from collections import Counter

import pytest
import ray

from service.ray_client import NAMESPACE
from tests.api.test_end_to_end import assert_released
from tests.helpers import tiny_spec, wait_until
from tests.live import TERMINAL, Server, states_of, wait_for, wait_step

pytestmark = pytest.mark.slow


@pytest.fixture
def server(tmp_path, ray_address):
    srv = Server(tmp_path / "home", f"sqlite:///{tmp_path}/ty.db", ray_address).start()
    yield srv
    srv.stop()


def _no_duplicates(client, job_id: str, total_steps: int) -> list[dict]:
    events = client.get(f"/v1/jobs/{job_id}/events").json()["events"]
    transitions = Counter((e["data"].get("from"), e["state"]) for e in events if e["kind"] == "state")
    assert max(transitions.values()) == 1, transitions
    checkpoints = Counter(e["data"]["step"] for e in events if e["kind"] == "checkpoint")
    assert all(n == 1 for n in checkpoints.values()), checkpoints
    steps = [p["step"] for p in client.get(f"/v1/jobs/{job_id}/metrics").json()["points"]]
    assert steps == sorted(set(steps)) and steps[-1] == total_steps
    return events


# make test-all: make test re-attaches through tests/api/test_ha.py (the surviving replica takes over live supervisors)
@pytest.mark.exhaustive
def test_restart_reattaches_to_the_live_supervisor(server):
    spec = tiny_spec(**{"resources.workers": 2, "train.steps": 300, "checkpoint.every_steps": 50})
    with server.client() as c:
        job_id = c.post("/v1/jobs", json=spec).json()["id"]
        before = wait_step(c, job_id, 20)
        assert before["state"] == "RUNNING", before
    server.kill()  # SIGKILL: no clean-up; the detached supervisor keeps training on Ray
    assert ray.get_actor(before["supervisor"], namespace=NAMESPACE)
    server.start()
    with server.client() as c:
        job = wait_for(c, job_id, TERMINAL)
        assert job["state"] == "SUCCEEDED" and job["restarts"] == 0, job
        events = _no_duplicates(c, job_id, 300)
        assert "reattach" in [e["kind"] for e in events]
        assert states_of(events) == ["QUEUED", "STARTING", "RUNNING", "SUCCEEDED"]
        points = c.get(f"/v1/jobs/{job_id}/metrics").json()["points"]
        assert [p["step"] for p in points] == list(range(1, 301))  # the drain buffer kept what it was not told to drop
    assert_released(job)


def test_restart_recovers_a_job_whose_supervisor_died_too(server):
    spec = tiny_spec(**{"resources.workers": 2, "train.steps": 400, "checkpoint.every_steps": 20})
    with server.client() as c:
        job_id = c.post("/v1/jobs", json=spec).json()["id"]
        before = wait_step(c, job_id, 25)
        assert before["state"] == "RUNNING"

        def durable() -> bool:  # the step-20 save is async: on a loaded host it can outlast 5 steps
            events = c.get(f"/v1/jobs/{job_id}/events").json()["events"]
            return any(e["kind"] == "checkpoint" and e["data"]["step"] >= 20 for e in events)

        assert wait_until(durable, 60), "no durable checkpoint at step 20 within 60 s"
    server.kill()
    ray.kill(ray.get_actor(before["supervisor"], namespace=NAMESPACE), no_restart=True)  # e.g. its node went away
    server.start()
    with server.client() as c:
        job = wait_for(c, job_id, TERMINAL)
        assert job["state"] == "SUCCEEDED" and job["restarts"] == 1 and job["step"] == 400, job
        assert job["supervisor"] != before["supervisor"]
        events = _no_duplicates(c, job_id, 400)
        assert states_of(events) == ["QUEUED", "STARTING", "RUNNING", "RECOVERING", "RUNNING", "SUCCEEDED"]
        restart = next(e for e in events if e["kind"] == "restart")
        assert restart["data"]["resume_step"] >= 20 and "supervisor lost" in restart["message"]
        assert job["summary"]["final_loss"] < job["summary"]["initial_loss"]
    assert_released(job)
