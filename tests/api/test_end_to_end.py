"""Live end to end: a real `trainyard serve` process, a real local Ray, jobs that really train."""

from __future__ import annotations

import time

import pytest
import ray

from tests.db_fixtures import LIVE_BACKENDS, make_db_url
from tests.helpers import tiny_spec
from tests.live import Server, drop_pg_schema, states_of, wait_for, wait_step

pytestmark = pytest.mark.slow


@pytest.fixture(params=LIVE_BACKENDS)
def server(request, tmp_path, ray_address):
    url, schema = make_db_url(request.param, tmp_path)
    srv = Server(tmp_path / "home", url, ray_address).start()
    yield srv
    srv.stop()
    if schema:
        drop_pg_schema(schema)


@pytest.fixture
def sqlite_server(tmp_path, ray_address):
    srv = Server(tmp_path / "home", f"sqlite:///{tmp_path}/ty.db", ray_address).start()
    yield srv
    srv.stop()


def job_actors(job: dict) -> list[dict]:
    """Live Ray actors of this job: its supervisor(s) and the rank workers they own.
    (Workers lent by the warm pool leave with the placement group, checked separately.)"""
    actors = list(ray._private.state.actors().values())
    supervisors = [a for a in actors if a.get("Name") == job["supervisor"]]
    ports = {(a["Address"]["IPAddress"], a["Address"]["Port"]) for a in supervisors}
    owned = [a for a in actors if (a["OwnerAddress"]["IPAddress"], a["OwnerAddress"]["Port"]) in ports]
    return [a for a in supervisors + owned if a["State"] != "DEAD"]


def job_placement_groups(job_id: str) -> list[dict]:
    return [p for p in ray.util.placement_group_table().values()
            if p["state"] != "REMOVED" and p.get("name", "").startswith(f"ty-{job_id}")]


def eventually(check, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def assert_released(job: dict) -> None:
    assert job["supervisor"], job
    def check():
        assert job_actors(job) == [], job_actors(job)
        assert job_placement_groups(job["id"]) == []
    eventually(check)


def test_submit_trains_to_succeeded_with_events_metrics_and_artefacts(server):
    with server.client() as c:
        spec = tiny_spec(**{"resources.workers": 2, "train.steps": 30, "checkpoint.every_steps": 10})
        job = c.post("/v1/jobs", json=spec).json()
        job = wait_for(c, job["id"], {"SUCCEEDED", "FAILED", "CANCELLED"})
        assert job["state"] == "SUCCEEDED", job
        assert job["step"] == 30 and job["restarts"] == 0 and job["layout"]["dp"] == 2
        summary = job["summary"]
        assert summary["final_loss"] < summary["initial_loss"]
        assert summary["params_sha256"]

        events = c.get(f"/v1/jobs/{job['id']}/events").json()["events"]
        assert states_of(events) == ["QUEUED", "STARTING", "RUNNING", "SUCCEEDED"]
        assert 30 in {e["data"]["step"] for e in events if e["kind"] == "checkpoint"}

        series = c.get(f"/v1/jobs/{job['id']}/metrics").json()
        points = series["points"]
        assert series["bubble_fraction_theoretical"] is None  # no pipeline, no bubble
        assert [p["step"] for p in points] == list(range(1, 31))
        assert points[-1]["loss"] < points[0]["loss"] and all(p["samples_per_s"] > 0 for p in points)

        ckpts = c.get(f"/v1/jobs/{job['id']}/checkpoints").json()
        assert ckpts["model"]["available"]
        assert [cp["step"] for cp in ckpts["checkpoints"] if cp["available"]] == [20, 30]  # keep: 2
        model = c.get(f"/v1/jobs/{job['id']}/checkpoints/model")
        assert model.status_code == 200 and len(model.content) == ckpts["model"]["bytes"] > 0

        assert "ready at step 0" in c.get(f"/v1/jobs/{job['id']}/logs", params={"rank": 1}).text
        assert "SUCCEEDED" in c.get(f"/v1/jobs/{job['id']}/logs", params={"rank": "supervisor"}).text
        followed = c.get(f"/v1/jobs/{job['id']}/logs", params={"rank": 0, "follow": True}, timeout=30)
        assert followed.status_code == 200 and "ready at step 0" in followed.text  # ends: the job is over

        prom = c.get("/metrics").text
        assert f'trainyard_job_step{{job="{job["id"]}",name="tiny"}} 30.0' in prom
        assert f'trainyard_job_loss{{job="{job["id"]}"' in prom
        assert 'trainyard_jobs{state="SUCCEEDED"} 1.0' in prom
    assert_released(job)


@pytest.mark.exhaustive  # make test: a program cancelled over REST (test_programs), a run's teardown (test_runtime)
def test_cancel_mid_run_stops_the_job_and_releases_ray(sqlite_server):
    with sqlite_server.client() as c:
        spec = tiny_spec(**{"resources.workers": 2, "train.steps": 5000})
        job = c.post("/v1/jobs", json=spec).json()
        running = wait_step(c, job["id"], 5)
        assert running["state"] == "RUNNING", running
        assert job_placement_groups(job["id"]), "a running job holds its placement group"
        resp = c.post(f"/v1/jobs/{job['id']}/cancel")
        assert resp.status_code == 202 and resp.json()["cancel_requested"]
        job = wait_for(c, job["id"], {"CANCELLED", "SUCCEEDED", "FAILED"}, timeout=60)
        assert job["state"] == "CANCELLED" and job["step"] < 5000
        kinds = [(e["kind"], e["state"]) for e in c.get(f"/v1/jobs/{job['id']}/events").json()["events"]]
        assert ("cancel_requested", None) in kinds and kinds[-1] == ("state", "CANCELLED")
        assert c.post(f"/v1/jobs/{job['id']}/cancel").status_code == 409
    assert_released(job)


@pytest.mark.exhaustive  # its REST assertions run in make test within test_tracking_live's crash-restart test
def test_injected_crash_recovers_and_succeeds(sqlite_server):
    with sqlite_server.client() as c:
        spec = tiny_spec(**{"resources.workers": 2, "train.steps": 30, "checkpoint.every_steps": 10,
                            "fault_injection": [{"at_step": 15, "rank": 1, "kind": "crash"}]})
        job = c.post("/v1/jobs", json=spec).json()
        job = wait_for(c, job["id"], {"SUCCEEDED", "FAILED", "CANCELLED"})
        assert job["state"] == "SUCCEEDED" and job["restarts"] == 1, job
        events = c.get(f"/v1/jobs/{job['id']}/events").json()["events"]
        assert states_of(events) == ["QUEUED", "STARTING", "RUNNING", "RECOVERING", "RUNNING", "SUCCEEDED"]
        restart = next(e for e in events if e["kind"] == "restart")
        # resumes from the last checkpoint that was complete when rank 1 died (the async save at 10, or none)
        assert restart["data"]["resume_step"] in (0, 10) and "rank 1" in restart["message"]
        steps = [p["step"] for p in c.get(f"/v1/jobs/{job['id']}/metrics").json()["points"]]
        assert steps == list(range(1, 31))  # replayed steps 11-15 replaced, not duplicated
    assert_released(job)


def test_a_slow_rank_is_rebalanced_live_and_the_user_sees_it(sqlite_server):
    with sqlite_server.client() as c:
        spec = tiny_spec(**{"resources.workers": 2, "train.steps": 40, "train.global_batch_size": 32,
                            "checkpoint.every_steps": 0, "supervisor.straggler": {"policy": "rebalance", "window": 5},
                            "fault_injection": [{"at_step": 5, "rank": 1, "kind": "slow", "factor": 3.0}]})
        job = c.post("/v1/jobs", json=spec).json()
        job = wait_for(c, job["id"], {"SUCCEEDED", "FAILED", "CANCELLED"})
        assert job["state"] == "SUCCEEDED" and job["restarts"] == 0, job
        events = c.get(f"/v1/jobs/{job['id']}/events").json()["events"]
        assert states_of(events) == ["QUEUED", "STARTING", "RUNNING", "SUCCEEDED"]  # no restart
        straggler = next(e for e in events if e["kind"] == "straggler")
        assert straggler["data"]["rank"] == 1 and straggler["message"].startswith("rank 1 is slow")
        rebalances = [e for e in events if e["kind"] == "rebalance"]  # a second one refines the split
        shares = rebalances[0]["data"]["shares"]
        assert shares[1] < shares[0] and sum(shares) == 32 and "without a restart" in rebalances[0]["message"]
        actions = {line.split('action="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
                   for line in c.get("/metrics").text.splitlines()
                   if line.startswith("trainyard_straggler_actions_total{") and job["id"] in line}
        assert actions["rebalanced"] == len(rebalances) and actions["rebalance_planned"] >= len(rebalances)
    assert_released(job)


def test_fault_injection_is_refused_unless_the_server_allows_it(tmp_path, ray_address):
    srv = Server(tmp_path / "home", f"sqlite:///{tmp_path}/ty.db", ray_address,
                 TRAINYARD_ALLOW_FAULT_INJECTION="0").start()
    try:
        with srv.client() as c:
            spec = tiny_spec(fault_injection=[{"at_step": 5, "rank": 0, "kind": "crash"}])
            resp = c.post("/v1/jobs", json=spec)
            assert resp.status_code == 422 and "fault_injection is refused" in resp.text
    finally:
        srv.stop()


def test_the_service_removes_a_placement_group_ray_leaked_for_its_job(sqlite_server):
    """Ray keeps a group whose supervisor was killed while creating it (service/leaked_groups.py): the
    leader removes a group of its job that no supervisor can use, and leaves others' groups alone."""
    from ray.util.placement_group import placement_group, remove_placement_group

    from workers.runtime.group_owner import GroupOwner

    with sqlite_server.client() as c:
        resp = c.post("/v1/jobs", json=tiny_spec(**{"train.steps": 2}))
        assert resp.status_code == 201, resp.text
        job = wait_for(c, resp.json()["id"], {"SUCCEEDED", "FAILED", "CANCELLED"})
    assert job["state"] == "SUCCEEDED", job
    leaked = placement_group([{"CPU": 0.01}], name=GroupOwner(job["id"], 1).group_name(0))
    foreign = placement_group([{"CPU": 0.01}], name=GroupOwner("not-this-services-job", 0).group_name(0))
    try:
        ray.get([leaked.ready(), foreign.ready()], timeout=30)
        eventually(lambda: _assert_no_group_of(job["id"]), timeout=60)  # a sweep, its 10 s grace, the next
        assert [p for p in ray.util.placement_group_table().values()
                if p["state"] != "REMOVED" and p["name"].startswith("ty-not-this-services-job-pg-")]
    finally:
        remove_placement_group(foreign)
        remove_placement_group(leaked)


def _assert_no_group_of(job_id: str) -> None:
    assert job_placement_groups(job_id) == []
