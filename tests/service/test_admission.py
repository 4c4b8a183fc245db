"""Admission without HTTP (service/admission/): a submit commits its job and audit record together,
replays by idempotency key, and every refusal is a typed value naming its field."""

from __future__ import annotations

import asyncio
import threading

import pytest
from sqlalchemy import func, select

from service.admission.submit import Admission, Submission
from service.db import tenants as tenant_repo
from service.db.group_commit import GroupCommit
from service.db.models import AuditRecord
from service.db.row_counts import row_counts
from service.quotas import NeverWithinQuota, prepare_submits
from service.records import JobRecord, Principal
from service.refusals import Conflict, InvalidRequest, NeverFits, NotAllowed, OverQuota
from service.settings import Settings
from tests.helpers import tiny_spec


@pytest.fixture
def admit(sessions, tmp_path):
    """submit(body, key=None, scopes=(...), capacity=None) -> Admitted, as the tenant `acme`."""
    with sessions.begin() as s:
        tenant, _ = tenant_repo.create_tenant(s, "acme", max_workers=2)
    writes = GroupCommit(sessions, prepare=prepare_submits)
    settings = Settings(home=tmp_path, max_active_jobs_per_tenant=2)
    wake = threading.Event()

    def submit(body: dict, key: str | None = None, scopes=("read", "submit"), capacity=None):
        admission = Admission(settings, writes, lambda: capacity, wake)
        caller = Principal(tenant.id, 1, "default", frozenset(scopes))
        return asyncio.run(admission.submit(Submission(caller, body, 0, key)))

    submit.wake = wake
    yield submit
    writes.close()


def _audited(sessions) -> int:
    with sessions() as s:
        return s.scalar(select(func.count()).select_from(AuditRecord).where(AuditRecord.action == "job.submit"))


def test_a_submit_commits_a_queued_job_record_and_its_audit_record(admit, sessions):
    admitted = admit(tiny_spec(), key="k1")
    assert isinstance(admitted.job, JobRecord) and admitted.created and admitted.job.state == "QUEUED"
    assert admit.wake.is_set() and _audited(sessions) == 1
    replay = admit(tiny_spec(), key="k1")
    assert replay.job.id == admitted.job.id and not replay.created and _audited(sessions) == 2
    with pytest.raises(Conflict) as refused:
        admit(tiny_spec(**{"train.steps": 3}), key="k1")
    assert refused.value.field is None and "idempotency-key" in refused.value.message


def test_every_quota_is_a_typed_refusal(admit):
    with pytest.raises(NeverWithinQuota) as refused:  # the tenant may hold 2 workers at once
        admit(tiny_spec(**{"resources.workers": 4}))
    assert isinstance(refused.value, NeverFits) and refused.value.field == "resources.workers"
    admit(tiny_spec())
    admit(tiny_spec())
    with pytest.raises(OverQuota, match="2 queued or running jobs"):  # the server's open-jobs cap
        admit(tiny_spec())


def test_gates_and_the_cluster_refuse_before_anything_is_written(admit, sessions):
    with pytest.raises(NotAllowed) as refused:  # needs a token with the admin scope
        admit(tiny_spec(fault_injection=[{"at_step": 3, "kind": "crash"}]))
    assert refused.value.field == "fault_injection"
    user_data = {"data": {"entrypoint": "tests.fixtures.user_code:make_dataset"},
                 "model": {"name": "mlp", "in_features": 4}, "train.loss": "mse"}
    with pytest.raises(NotAllowed) as refused:  # acme may not run user code
        admit(tiny_spec(**user_data))
    assert refused.value.field == "data.entrypoint"
    with pytest.raises(NeverFits) as refused:
        admit(tiny_spec(), capacity=({"CPU": 0.5}, {"CPU": 0.5}))
    assert refused.value.field == "resources" and refused.value.message.startswith("the job can never run")
    with pytest.raises(InvalidRequest, match="under the storage root") as refused:
        admit(tiny_spec(**{"train.init_from": "/etc/passwd"}))
    assert refused.value.field == "train.init_from"
    with sessions() as s:
        assert row_counts(s)["jobs"] == 0


def test_a_program_needs_user_code_and_stored_code_or_a_confined_path(admit, sessions, tmp_path):
    program = {"name": "prog", "program": {"command": ["python", "train.py"]}, "resources": {"workers": 1}}

    def with_dir(working_dir):
        return {**program, "program": {**program["program"], "working_dir": working_dir}}

    with pytest.raises(NotAllowed, match="program: tenant 'acme' may not run user code") as refused:
        admit(program)
    assert refused.value.field == "program"
    with sessions.begin() as s:
        tenant_repo.find_tenant(s, "acme").allow_user_code = True
    sha = "c" * 64
    with pytest.raises(InvalidRequest, match="is not uploaded code") as refused:
        admit(with_dir(f"code:{sha}"))
    assert refused.value.field == "program.working_dir"
    with pytest.raises(InvalidRequest, match="not a code reference"):
        admit(with_dir("code:../../etc"))
    with pytest.raises(InvalidRequest, match="under the storage root") as refused:
        admit(with_dir("/etc"))
    assert refused.value.field == "program.working_dir"
    with sessions() as s:
        assert row_counts(s)["jobs"] == 0
    (tmp_path / "storage" / "code").mkdir(parents=True)
    (tmp_path / "storage" / "code" / f"{sha}.zip").write_bytes(b"")  # stored (the store checked it at upload)
    assert admit(with_dir(f"code:{sha}")).job.spec["program"]["working_dir"] == f"code:{sha}"
    relative = admit(with_dir("team/code")).job.spec["program"]["working_dir"]
    assert relative == str((tmp_path / "storage" / "team" / "code").resolve())
