"""Preemption on a live service (TRAINYARD_PREEMPTION): a tenant at its max_workers quota submits a
higher-priority job; its running lower-priority job checkpoints, goes back to QUEUED, waits for the
high one to finish, resumes from its checkpoint and completes. Without the setting the high job waits."""

from __future__ import annotations

import uuid
from datetime import datetime

import pytest

from tests.helpers import tiny_spec
from tests.live import TERMINAL, Server, states_of, wait_for, wait_step

pytestmark = pytest.mark.slow

LOW_STEPS = 60


def serve(tmp_path, ray_address, **env):
    return Server(tmp_path / "home", f"sqlite:///{tmp_path}/ty.db", ray_address, **env).start()


def scenario(server):
    """Low-priority 2-worker job running, then a high-priority one: (client, low, high) once both ended."""
    with server.client() as admin:
        tenant = admin.post("/v1/tenants", json={"name": f"p-{uuid.uuid4().hex[:6]}", "max_workers": 2,
                                                 "quota_mode": "queue"}).json()
    two = {"resources.workers": 2, "parallel.dp": 2, "checkpoint.every_steps": 5}
    c = server.client(tenant["token"])
    low = c.post("/v1/jobs", json=tiny_spec(**two, **{"train.steps": LOW_STEPS}), params={"priority": 0}).json()
    wait_for(c, low["id"], {"RUNNING"}, timeout=240)
    assert wait_step(c, low["id"], 7, timeout=240)["state"] == "RUNNING"
    high = c.post("/v1/jobs", json=tiny_spec(**two, **{"train.steps": 20}), params={"priority": 5}).json()
    high = wait_for(c, high["id"], TERMINAL, timeout=600)
    low = wait_for(c, low["id"], TERMINAL, timeout=600)
    return c, low, high


def events(c, job_id):
    return c.get(f"/v1/jobs/{job_id}/events").json()["events"]


def at(event) -> datetime:
    return datetime.fromisoformat(event["ts"])


def test_a_higher_priority_job_preempts_checkpoints_and_the_low_one_resumes(tmp_path, ray_address):
    server = serve(tmp_path, ray_address, TRAINYARD_PREEMPTION="true")
    try:
        c, low, high = scenario(server)
        low_events = events(c, low["id"])
    finally:
        server.stop()
    assert (low["state"], high["state"]) == ("SUCCEEDED", "SUCCEEDED"), (low, high)
    # RUNNING -> QUEUED once, then admitted again after the high job ended
    assert states_of(low_events) == ["QUEUED", "STARTING", "RUNNING", "QUEUED", "STARTING", "RUNNING", "SUCCEEDED"]
    [preempted] = [e for e in low_events if e["kind"] == "preempted"]
    assert preempted["data"]["by"] == high["id"]
    resume = preempted["data"]["checkpoint_step"]
    assert 0 < resume < LOW_STEPS and resume % 5 == 0 and preempted["data"]["step"] == resume  # nothing lost
    assert any(e["kind"] == "preempt_requested" and e["data"]["by"] == high["id"] for e in low_events)
    starts = [e for e in low_events if e["kind"] == "state" and e["state"] == "STARTING"]
    assert at(starts[1]) >= datetime.fromisoformat(high["finished_at"])  # the quota held it until then
    running = [e for e in low_events if e["kind"] == "state" and e["state"] == "RUNNING"]
    assert f"training from step {resume}" in running[1]["message"]  # resumed from the checkpoint, not step 0
    # correct total steps; a preemption is not a failure
    assert low["step"] == LOW_STEPS and low["summary"]["steps"] == LOW_STEPS
    assert low["restarts"] == 0 and low["summary"]["restarts"] == 0 and low["summary"]["preemptions"] == 1
    assert high["summary"]["preemptions"] == 0


@pytest.mark.exhaustive  # make test: tests/service/test_scheduler.py holds that a higher priority waits without it
def test_without_the_setting_the_high_priority_job_waits(tmp_path, ray_address):
    server = serve(tmp_path, ray_address)
    try:
        c, low, high = scenario(server)
        low_events = events(c, low["id"])
        high_events = events(c, high["id"])
    finally:
        server.stop()
    assert (low["state"], high["state"]) == ("SUCCEEDED", "SUCCEEDED"), (low, high)
    assert not [e for e in low_events if e["kind"] in ("preempted", "preempt_requested")]
    assert states_of(low_events) == ["QUEUED", "STARTING", "RUNNING", "SUCCEEDED"]
    start = [e for e in high_events if e["kind"] == "state" and e["state"] == "STARTING"][0]
    assert at(start) >= datetime.fromisoformat(low["finished_at"])
