"""A lost supervisor's replacement resumes from the job's newest complete checkpoint, whoever wrote it:
Trainyard's own DCP checkpoints, or a program's own files (found by the soak: for a program the
reconciler looked for DCP checkpoints only, so the restart said "from step 0" and steps trained but
lost with the supervisor left no `telemetry_gap` event)."""

from __future__ import annotations

import pytest

from service.db import repository as repo
from service.db import tenants as tenant_repo
from service.lifecycle import JobState
from service.live_metrics import LiveMetrics
from service.reconciler import Reconciler
from service.settings import Settings
from tests.helpers import spec_of
from tests.service.test_restart_budgets import RecordingLauncher
from workers.checkpointing import checkpoint_root, step_name
from workers.spec_loading import parse_spec

PROGRAM = {"name": "prog", "program": {"command": ["python", "train.py"]}, "resources": {"workers": 2}}


def _trainer_checkpoints(settings: Settings, job_id: str) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    root = checkpoint_root(settings.job_storage(job_id))
    for step in (5, 10):
        dcp.save({"w": torch.full((4,), float(step))}, checkpoint_id=str(root.local_path / step_name(step)))
    root.write_bytes(f"{step_name(15)}/__0_0.distcp", b"x")  # no metadata: incomplete, never the resume point


def _program_checkpoints(settings: Settings, job_id: str) -> None:
    root = settings.job_storage(job_id) / "checkpoints"
    for step in (5, 10):
        root.write_bytes(f"step-{step}.pt", b"x")
    root.write_bytes("step-15.tmp", b"x")  # being written: not complete


@pytest.mark.parametrize("spec, write", [(spec_of(**{"train.steps": 20}), _trainer_checkpoints),
                                         (parse_spec(PROGRAM), _program_checkpoints)], ids=["trainer", "program"])
def test_a_replacement_resumes_from_the_newest_complete_checkpoint(sessions, tmp_path, spec, write):
    settings = Settings(home=tmp_path)
    with sessions.begin() as s:
        tenant, _ = tenant_repo.create_tenant(s, "acme")
        job = repo.create_job(s, tenant.id, spec, 0, "sha", None, max_open_jobs=10)
        repo.transition(s, job, JobState.STARTING, "admitted")
        repo.transition(s, job, JobState.RUNNING, "running")
        job.drained_seq, job.step = 7, 3  # the drains stored steps up to 3; the run got to 10 and more
        job_id = job.id
    write(settings, job_id)
    launcher = RecordingLauncher()
    Reconciler(sessions, settings, launcher=launcher, metrics=LiveMetrics()).recover(job_id)
    assert [epoch for _, epoch, _ in launcher.launched] == [1]
    with sessions() as s:
        job = repo.get_job(s, job_id)
        events = {e.kind: e.data for e in repo.list_events(s, job_id, 0, 100)}
    assert job.state == JobState.RECOVERING and job.step == 10
    assert events["restart"]["resume_step"] == 10
    assert events["telemetry_gap"] == {"from_step": 4, "to_step": 10}
