"""A supervisor resource no Ray node offers is said, not a silent hang (issue 48): on the session's
real Ray, /readyz reports not ready naming TRAINYARD_SUPERVISOR_RESOURCE and the resource, and a job
admitted meanwhile gets an event saying why it waits for its supervisor."""

from __future__ import annotations

import time

import ray
from fastapi.testclient import TestClient

from api.http.app import create_app
from service.db import repository as repo
from service.db import tenants as tenant_repo
from service.lifecycle import JobState
from service.ray_client import NAMESPACE
from service.settings import Settings
from service.supervisor.placement import placement_problem
from tests.db_fixtures import live_db_url  # noqa: F401
from tests.helpers import spec_of

ABSENT = "trainyard-test-absent"


def test_the_nodes_either_offer_the_resource_or_the_problem_names_it(ray_cluster):
    nodes = ray.nodes()
    assert placement_problem("", 0, nodes) is None
    assert placement_problem("CPU", 0, nodes) is None  # a resource the local node offers
    absent = placement_problem(ABSENT, 0, nodes)
    assert absent is not None and "TRAINYARD_SUPERVISOR_RESOURCE" in absent and repr(ABSENT) in absent
    too_big = placement_problem("CPU", 10**9, nodes)  # no node has a petabyte of Ray memory
    assert too_big is not None and "TRAINYARD_SUPERVISOR_MEMORY_MB=1000000000" in too_big


def test_readyz_and_the_jobs_events_say_why_no_supervisor_starts(ray_address, live_db_url, tmp_path):  # noqa: F811
    settings = Settings(home=tmp_path, database_url=live_db_url, ray_address=ray_address, loop_interval_s=0.2,
                        standby_supervisors=0, warm_workers=0, supervisor_resource=ABSENT)
    spec = spec_of(**{"train.steps": 5})
    name = None
    with TestClient(create_app(settings)) as client:  # the app's own control plane, started and stopped with it
        plane = client.app.state.plane
        try:
            with plane.sessions.begin() as s:
                job_id = repo.create_job(s, tenant_repo.ensure_tenant(s, "acme").id, spec, 0, "sha", None, None).id
            plane.wake.set()
            deadline, waiting = time.monotonic() + 30, []
            while not waiting and time.monotonic() < deadline:
                time.sleep(0.1)
                with plane.sessions() as s:
                    waiting = [e for e in repo.list_events(s, job_id, 0, 100) if e.kind == "supervisor_waiting"]
                    job = repo.get_job(s, job_id)
                    state, name = job.state, job.supervisor_name
            assert waiting, "no event says why the job waits"
            assert "TRAINYARD_SUPERVISOR_RESOURCE" in waiting[0].message and repr(ABSENT) in waiting[0].message
            assert state == JobState.STARTING
            ready = client.get("/readyz")
            assert ready.status_code == 503
            check = ready.json()["checks"]["supervisors"]
            assert "TRAINYARD_SUPERVISOR_RESOURCE" in check and repr(ABSENT) in check
        finally:
            if name:  # the supervisor Ray could never place: not left pending
                try:
                    ray.kill(ray.get_actor(name, namespace=NAMESPACE), no_restart=True)
                except ValueError:
                    pass
