"""Jobs over REST on the share-nothing bed with their storage on a real S3 API: nodes share no disk and
no address, so everything the control plane serves (checkpoints, the model, logs) and everything a
restarted rank reads back must come through the store (issue 20).

The head has no CPUs, so every rank runs on a worker node that the node-loss test may kill.
"""

from __future__ import annotations

import re

import boto3
import pytest

from tests.helpers import tiny_spec
from tests.live import TERMINAL, Server, wait_for, wait_step
from tests.s3_server import S3Server
from tests.sharenothing.cluster import ShareNothingCluster

# ~5 min, most of it the service starting on the bed: make test-all. make test runs S3 jobs over REST on
# one host (tests/api/test_storage_s3_jobs.py, tests/service/test_store_jobs.py) and the bed itself (test_bed).
pytestmark = [pytest.mark.slow, pytest.mark.exhaustive]

BUCKET, PREFIX = "bed-jobs", "trainyard"
DDP = {"resources.workers": 2, "parallel": {"dp": 2}, "train.steps": 30, "checkpoint": {"every_steps": 5, "keep": 2}}
FSDP = {**DDP, "parallel": {"dp": 2, "zero": 3}}


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    cluster = ShareNothingCluster(tmp_path_factory.mktemp("bed"), workers=2, head_cpus=0).start()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def store(bed, tmp_path_factory):
    """The S3 server on the bridge address: the control plane and every node reach it there."""
    server = S3Server(tmp_path_factory.mktemp("bed-s3"), host=bed.host_ip).start()
    server.create_bucket(BUCKET)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(bed, store, tmp_path_factory):
    server = Server(tmp_path_factory.mktemp("serve"), "", TRAINYARD_STORAGE_URI=f"s3://{BUCKET}/{PREFIX}",
                    TRAINYARD_WARM_WORKERS="2", **store.env, **bed.control_plane_env())
    server.start(timeout=240)
    try:
        with server.client() as c:
            yield c
    finally:
        server.stop()


def bucket_keys(store: S3Server, job_id: str) -> list[str]:
    s3 = boto3.client("s3", endpoint_url=store.endpoint, region_name=store.env["AWS_REGION"],
                      aws_access_key_id=store.env["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=store.env["AWS_SECRET_ACCESS_KEY"])
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{PREFIX}/jobs/{job_id}/")
    return [o["Key"].split(f"/jobs/{job_id}/", 1)[1] for page in pages for o in page.get("Contents", [])]


def job_files_on_nodes(bed: ShareNothingCluster, job_id: str) -> dict[str, list[str]]:
    """What each node keeps of the job on its own disk: under the storage path, or a log not yet shipped."""
    return {n: [f for f in bed.files_on(n) + bed.files_on(n, "/tmp") if job_id in f or "trainyard-log-" in f]
            for n in bed.names}


def node_holding_a_rank(bed: ShareNothingCluster) -> str:
    """A worker node with a running rank: its log, not yet shipped whole, is on that node's disk."""
    holding = [n for n in bed.names[1:]
               if any(re.search(r"trainyard-log-.*/rank-\d+\.log$", f) for f in bed.files_on(n, "/tmp"))]
    assert holding, f"no worker node holds a rank: {[bed.files_on(n, '/tmp') for n in bed.names]}"
    return holding[0]


@pytest.fixture(scope="module")
def finished(client):
    """A DDP and an FSDP job submitted together; each as it ended."""
    ids = {name: client.post("/v1/jobs", json=tiny_spec(name=f"bed-{name}", **extra)).raise_for_status().json()["id"]
           for name, extra in (("ddp", DDP), ("fsdp", FSDP))}
    return {name: wait_for(client, job_id, TERMINAL, timeout=900) for name, job_id in ids.items()}


@pytest.mark.parametrize("name", ["ddp", "fsdp"])
def test_a_job_keeps_its_files_in_the_bucket_and_serves_them_over_rest(bed, store, client, finished, name):
    job = finished[name]
    assert job["state"] == "SUCCEEDED", job
    keys = bucket_keys(store, job["id"])
    assert "model.safetensors" in keys and any(k.startswith("logs/rank-1/") for k in keys), keys
    steps = sorted({int(m.group(1)) for k in keys if (m := re.match(r"checkpoints/step-(\d+)/\.metadata$", k))})
    assert steps == [25, 30], keys  # keep 2
    listed = client.get(f"/v1/jobs/{job['id']}/checkpoints").json()
    assert [(c["step"], c["available"]) for c in listed["checkpoints"]][-2:] == [(25, True), (30, True)], listed
    model = client.get(f"/v1/jobs/{job['id']}/checkpoints/model")
    assert model.status_code == 200 and len(model.content) == listed["model"]["bytes"] > 0
    assert "finished" in client.get(f"/v1/jobs/{job['id']}/logs", params={"rank": 1}).text
    assert client.get(f"/v1/jobs/{job['id']}/logs", params={"rank": "supervisor"}).text.strip()
    assert job_files_on_nodes(bed, job["id"]) == {n: [] for n in bed.names}, "a job file stayed on a node's disk"


def test_a_rank_node_lost_mid_run_restarts_from_the_store_bit_identical(bed, client, finished):
    """A worker node holding a rank is killed after a checkpoint: the job restarts on what is left, from
    the store's latest complete checkpoint, and ends with the fault-free DDP job's parameters."""
    spec = tiny_spec(name="bed-node-loss", **DDP)
    job_id = client.post("/v1/jobs", json=spec).raise_for_status().json()["id"]
    running = wait_step(client, job_id, 12, timeout=600)
    assert running["state"] == "RUNNING", running
    doomed = node_holding_a_rank(bed)
    bed.kill_node(doomed)
    bed.wait_node_state(doomed, alive=False)
    job = wait_for(client, job_id, TERMINAL, timeout=900)
    bed.restart_node(doomed)  # the module's other tests and its teardown see the whole cluster
    assert job["state"] == "SUCCEEDED", job
    kinds = [e["kind"] for e in client.get(f"/v1/jobs/{job_id}/events").json()["events"]]
    assert "restart" in kinds or "recovering" in kinds, kinds
    assert job["summary"]["params_sha256"] == finished["ddp"]["summary"]["params_sha256"]


def test_an_elastic_job_shrinks_and_reshards_from_the_store_when_a_node_is_lost(bed, client):
    """4 ranks of 2 CPUs fill both workers, min_workers 2: one worker node lost, the job goes on with 2
    ranks on the other, loading the store's latest complete checkpoint under the smaller layout."""
    spec = tiny_spec(name="bed-elastic", **{**DDP, "resources.workers": 4, "resources.min_workers": 2,
                                            "resources.cpus_per_worker": 2, "parallel": {"dp": 4},
                                            "train.steps": 40})
    submitted = client.post("/v1/jobs", json=spec)
    assert submitted.status_code == 201, submitted.text
    job_id = submitted.json()["id"]
    running = wait_step(client, job_id, 12, timeout=600)
    assert running["state"] == "RUNNING" and running["world_size"] == 4, running
    doomed = node_holding_a_rank(bed)
    bed.kill_node(doomed)
    bed.wait_node_state(doomed, alive=False)
    job = wait_for(client, job_id, TERMINAL, timeout=900)
    bed.restart_node(doomed)
    assert job["state"] == "SUCCEEDED", job
    events = client.get(f"/v1/jobs/{job_id}/events").json()["events"]
    resizes = [(e["data"]["from"]["world_size"], e["data"]["to"]["world_size"])
               for e in events if e["kind"] == "resize"]
    assert resizes and resizes[0] == (4, 2), resizes
    assert job["step"] == 40, job
