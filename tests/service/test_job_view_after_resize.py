"""The job's REST view reports the world size and layout it runs on now, after a resize."""

from __future__ import annotations

from api.http.schemas import job_out
from service.db import repository as repo
from service.db import tenants as tenant_repo
from service.lifecycle import JobState
from service.live_metrics import LiveMetrics
from service.reconciler import Reconciler
from service.settings import Settings
from tests.helpers import spec_of
from workers.events import ResizeEvent

LAYOUT_2 = {"dp": 2, "tp": 1, "pp": 1, "zero": 0, "strategy": "ddp", "world_size": 2}
LAYOUT_4 = {**LAYOUT_2, "dp": 4, "world_size": 4}


def test_a_shrunk_job_shows_its_current_world_size_and_layout(sessions, tmp_path):
    with sessions.begin() as s:
        tenant, _ = tenant_repo.create_tenant(s, "acme")
        job = repo.create_job(s, tenant.id, spec_of(**{"resources.workers": 4, "resources.min_workers": 2}), 0,
                              "sha", None, max_open_jobs=10)
        repo.transition(s, job, JobState.STARTING, "admitted")
        repo.transition(s, job, JobState.RUNNING, "running")
        job.supervisor_epoch = 1
        job_id = job.id
        assert job_out(job)["world_size"] == 4  # before the supervisor reported a layout: the one asked for
    resize = ResizeEvent(LAYOUT_4, LAYOUT_2, "only 2 worker slots available")
    drained = {"epoch": 1, "started": True, "restarts": 1, "done": False, "summary": None, "layout": LAYOUT_2,
               "records": [{"type": "event", "seq": 1, "kind": resize.kind, "message": resize.message,
                            "data": resize.data(), "event": resize}]}
    Reconciler(sessions, Settings(home=tmp_path), launcher=object(), metrics=LiveMetrics()).apply(job_id, drained)
    with sessions() as s:
        view = job_out(repo.get_job(s, job_id))
    assert view["world_size"] == 2 and view["layout"] == LAYOUT_2
