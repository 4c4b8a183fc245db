"""A job whose files live on Google Cloud Storage (a real GCS JSON API: gcp-storage-emulator over
HTTP), trained by a JobRun on the session's real Ray: the ranks reach the store through the forwarded
STORAGE_EMULATOR_HOST, checkpoints and the model land in the bucket, nothing of the job on disk."""

from __future__ import annotations

import uuid

import pytest
from safetensors.torch import load as load_safetensors

from service.supervisor.run import JobRun
from tests.helpers import Events, spec_of
from workers.checkpointing import complete_checkpoints, state_sha256
from workers.storage import Storage, local_dir

pytestmark = pytest.mark.slow


def test_a_job_keeps_its_checkpoints_and_model_on_gcs(ray_cluster, gcs_store):
    job = Storage.at(gcs_store.create_bucket(f"gcs-{uuid.uuid4().hex[:8]}") + "/jobs/gcs")
    spec = spec_of(**{"resources.workers": 2, "train.steps": 8, "checkpoint.every_steps": 4, "checkpoint.keep": 2})
    summary = JobRun(spec, job, job.name, listener=Events()).run()
    assert summary["state"] == "SUCCEEDED", summary["error"]
    assert summary["export_path"] == job.url("model.safetensors") and job.uri.startswith("gs://")
    assert [s for s, _ in complete_checkpoints(job)] == [4, 8]
    assert state_sha256(load_safetensors(job.read_bytes("model.safetensors"))) == summary["params_sha256"]
    scratch = local_dir(job)  # this node keeps the logs only
    left = sorted(p.relative_to(scratch).as_posix() for p in scratch.rglob("*") if p.is_file())
    assert all(name.startswith("logs/") for name in left), left
