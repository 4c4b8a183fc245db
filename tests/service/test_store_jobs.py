"""Jobs whose files live on an object store (a real S3 API: moto's server over HTTP), trained by a
JobRun on the session's real Ray: nothing of the job on a local disk, checkpoints and the model in the
bucket, restarts and resharding from the store, a lost shard skipped, a store outage ridden out or
failing the job with that cause."""

from __future__ import annotations

import threading
import uuid

import pytest
from safetensors.torch import load as load_safetensors

from service.supervisor.run import JobRun
from tests.helpers import Events, spec_of
from tests.tcp_forward import TcpForward
from workers.checkpointing import checkpoint_root, complete_checkpoints, state_sha256, step_name
from workers.storage import Storage, local_dir

pytestmark = pytest.mark.slow

BASE = {"resources.workers": 2, "train.steps": 12, "checkpoint.every_steps": 4, "checkpoint.keep": 3}
LAYOUTS = {"ddp": {}, "fsdp": {"parallel.zero": 3}}


class Until(Events):
    """Events, and a callback once a step is reached."""

    def __init__(self, step: int | None = None, then=None):
        super().__init__()
        self.step, self.then, self.fired = step, then, False

    def on_step(self, record):
        super().on_step(record)
        if self.step is not None and record["step"] >= self.step and not self.fired:
            self.fired = True
            self.then()


def new_job(s3_server, name: str) -> Storage:
    return Storage.at(s3_server.create_bucket(f"{name}-{uuid.uuid4().hex[:8]}") + f"/jobs/{name}")


def run(spec, job: Storage, listener: Events | None = None) -> tuple[dict, Events]:
    rec = listener or Events()
    return JobRun(spec, job, job.name, listener=rec).run(), rec


def copy_checkpoint(src: Storage, dst: Storage, step: int) -> None:
    for name in checkpoint_root(src).list(step_name(step)):
        rel = f"{step_name(step)}/{name}"
        checkpoint_root(dst).write_bytes(rel, checkpoint_root(src).read_bytes(rel))


@pytest.fixture(scope="module")
def trained(ray_cluster, s3_server):
    """The two layouts trained once each on the store: layout -> (job storage, summary, step records)."""
    done = {}

    def get(layout: str):
        if layout not in done:
            job = new_job(s3_server, layout)
            summary, rec = run(spec_of(**BASE, **LAYOUTS[layout]), job)
            done[layout] = (job, summary, rec.steps)
        return done[layout]
    return get


@pytest.mark.parametrize("layout", ["ddp", "fsdp"])
def test_job_keeps_checkpoints_and_model_in_the_bucket_and_nothing_on_disk(trained, layout):
    job, summary, _ = trained(layout)
    assert summary["state"] == "SUCCEEDED", summary["error"]
    assert summary["job_dir"] == job.uri and summary["export_path"] == job.url("model.safetensors")
    assert [s for s, _ in complete_checkpoints(job)] == [4, 8, 12]  # keep 3: the final one included
    assert state_sha256(load_safetensors(job.read_bytes("model.safetensors"))) == summary["params_sha256"]
    # This node keeps the logs only (shipping them is the log files' part): no job state on its disk.
    scratch = local_dir(job)
    left = sorted(p.relative_to(scratch).as_posix() for p in scratch.rglob("*") if p.is_file())
    assert all(name.startswith("logs/") for name in left), left


def test_crash_resumes_from_the_store_bit_identical(trained, s3_server):
    _, clean, _ = trained("ddp")
    job = new_job(s3_server, "crash")
    summary, rec = run(spec_of(**BASE, fault_injection=[{"at_step": 11, "rank": 1, "kind": "crash"}]), job)
    assert summary["state"] == "SUCCEEDED" and summary["restarts"] == 1, summary["error"]
    restart = [data for kind, data in rec.events if kind == "restart"]
    assert restart[0]["resume_step"] in (4, 8)
    assert job.exists("faults/fired-0")  # the marker that keeps the crash from firing again is on the store
    assert summary["params_sha256"] == clean["params_sha256"]


def test_fsdp_checkpoint_reshards_to_one_worker_from_the_store(trained, s3_server):
    src, _, steps = trained("fsdp")
    job = new_job(s3_server, "reshard")
    copy_checkpoint(src, job, 8)
    summary, rec = run(spec_of(**{**BASE, "resources.workers": 1}), job)
    assert summary["state"] == "SUCCEEDED", summary["error"]
    assert [s["step"] for s in rec.steps] == [9, 10, 11, 12]
    for s in rec.steps:
        assert s["loss"] == pytest.approx(steps[s["step"] - 1]["loss"], rel=1e-4), s["step"]


def test_checkpoint_missing_a_shard_is_skipped_for_the_previous_one(trained, s3_server):
    src, _, steps = trained("ddp")
    job = new_job(s3_server, "shard")
    copy_checkpoint(src, job, 4)
    copy_checkpoint(src, job, 8)
    lost = next(n for n in checkpoint_root(job).list(step_name(8)) if n.startswith("__1_"))
    checkpoint_root(job).remove(f"{step_name(8)}/{lost}")  # rank 1's shard, gone with its node
    summary, rec = run(spec_of(**BASE), job)
    assert summary["state"] == "SUCCEEDED", summary["error"]
    assert ("checkpoint_incomplete", {"step": 8, "missing": [lost], "resume_step": 4}) in rec.events
    assert [s["step"] for s in rec.steps] == list(range(5, 13))
    assert [s["loss"] for s in rec.steps] == pytest.approx([s["loss"] for s in steps[4:]], rel=1e-6)


@pytest.fixture
def flaky_store(ray_cluster, s3_server, monkeypatch):
    """A bucket reached through a forwarder the test closes (the store gone) and reopens."""
    forward = TcpForward(s3_server.port)
    job = new_job(s3_server, "outage")
    monkeypatch.setenv("AWS_ENDPOINT_URL", forward.uri)  # forwarded to the ranks with the job
    return forward, job


def test_store_outage_during_a_save_is_ridden_out(flaky_store, s3_server, monkeypatch):
    forward, job = flaky_store
    monkeypatch.setenv("TRAINYARD_STORE_RETRY_S", "120")

    def go_away():  # before the save at step 4; back after longer than the client's own retries
        forward.go_down()
        threading.Timer(30.0, forward.come_back).start()

    summary, rec = run(spec_of(**BASE), job, Until(3, go_away))
    assert summary["state"] == "SUCCEEDED" and summary["restarts"] == 0, summary["error"]
    kinds = [kind for kind, _ in rec.events]
    assert "store_retry" in kinds and "store_recovered" in kinds, kinds
    assert [s["step"] for s in rec.steps] == list(range(1, 13))  # no step lost or replayed
    assert [s for s, _ in complete_checkpoints(job)] == [4, 8, 12]


@pytest.mark.exhaustive  # make test: an outage ridden out (test_store_outage_during_a_save_is_ridden_out)
def test_store_down_past_the_limit_fails_the_job_with_that_cause(flaky_store, monkeypatch):
    forward, job = flaky_store
    monkeypatch.setenv("TRAINYARD_STORE_RETRY_S", "15")  # > one attempt of the client (~5 s)
    summary, rec = run(spec_of(**BASE), job, Until(2, forward.close))
    assert summary["state"] == "FAILED" and summary["restarts"] == 0
    assert "StoreUnavailable" in summary["error"] and "TRAINYARD_STORE_RETRY_S=15" in summary["error"]
    assert "not retryable" in summary["error"]
    assert "store_retry" in [kind for kind, _ in rec.events]


def test_init_from_reads_the_store_by_uri_or_by_a_path_under_the_storage_root(trained):
    from workers.checkpointing import load_weights
    from workers.models import build_model
    from workers.training.trainer import init_source

    src, clean, _ = trained("ddp")
    spec = spec_of(**BASE)
    sibling = src.parent / "next"  # another job under the same storage root
    for given in (f"jobs/{src.name}/model.safetensors", src.uri, f"jobs/{src.name}"):
        model = build_model(spec)
        load_weights(init_source(given, sibling), model)
        assert state_sha256(model.state_dict()) == clean["params_sha256"], given
    model = build_model(spec)  # a checkpoint directory on the store: DCP's fsspec reader
    load_weights(init_source(checkpoint_root(src).url(step_name(12)), sibling), model)
    assert state_sha256(model.state_dict()) == clean["params_sha256"]


def test_an_hf_jobs_save_pretrained_directory_is_uploaded_and_loads_back(ray_cluster, s3_server, tmp_path):
    from transformers import AutoModelForCausalLM

    from tests.user_models import LLAMA_SPEC
    from workers.spec_loading import parse_spec

    job = new_job(s3_server, "hf")
    spec = parse_spec({**LLAMA_SPEC, "train": {"steps": 2, "global_batch_size": 4, "micro_batch_size": 2}})
    summary, _ = run(spec, job)
    assert summary["state"] == "SUCCEEDED", summary["error"]
    assert summary["hf_export_path"] == job.url("hf") and job.exists("hf/config.json")
    job.download("hf", tmp_path / "hf")  # what a user does with it: from_pretrained, no Trainyard
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), local_files_only=True)
    assert state_sha256(model.state_dict()) == summary["params_sha256"]  # the trained weights, not a fresh init
