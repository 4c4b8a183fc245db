"""Checkpoints on a job's storage, local, on a real S3 API (moto's server over HTTP) and on a real GCS
API (gcp-storage-emulator over HTTP), without Ray:
completeness from the metadata's shard list, pruning, retries through a store outage."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import torch
import torch.distributed.checkpoint as dcp

from tests.tcp_forward import TcpForward
from workers.checkpointing import (
    RetryPolicy,
    StoreUnavailable,
    checkpoint_root,
    complete_checkpoints,
    latest_checkpoint,
    prune,
    step_name,
)
from workers.checkpointing.retry import with_retries
from workers.checkpointing.writer import reader_for, writer_for
from workers.storage import Storage


@pytest.fixture(params=["local", "s3", "gs"])
def job(request, tmp_path):
    if request.param == "local":
        return Storage.at(tmp_path / "jobs" / "j")
    store = request.getfixturevalue("s3_server" if request.param == "s3" else "gcs_store")
    return Storage.at(store.create_bucket(f"ckpt-{uuid.uuid4().hex[:8]}") + "/jobs/j")


def save(job: Storage, step: int, value: float, events: list | None = None, policy: RetryPolicy | None = None):
    state = {"w": torch.full((64,), value), "progress": {"step": step}}
    writer = writer_for(checkpoint_root(job) / step_name(step), f"checkpoint {step}", 0,
                        policy or RetryPolicy(limit_s=5), (events if events is not None else []).append)
    dcp.save(state, storage_writer=writer, no_dist=True)


def load(checkpoint: Storage) -> float:
    state = {"w": torch.zeros(64)}
    dcp.load(state, storage_reader=reader_for(checkpoint), no_dist=True)
    return float(state["w"][0])


def test_a_checkpoint_missing_or_short_of_a_shard_is_never_latest(job):
    for step in (1, 2, 3, 4):
        save(job, step, float(step))
    root = checkpoint_root(job)
    shards = [n for n in root.list(step_name(4)) if n.endswith(".distcp")]
    assert shards, root.list(step_name(4))
    root.remove(f"{step_name(4)}/{shards[0]}")  # lost with its node
    data = root.read_bytes(f"{step_name(3)}/{shards[0]}")
    root.write_bytes(f"{step_name(3)}/{shards[0]}", data[: len(data) // 2])  # an upload cut short
    skipped: list = []
    step, latest = latest_checkpoint(job, lambda s, missing: skipped.append((s, missing)))
    assert step == 2 and load(latest) == 2.0
    assert skipped == [(4, [shards[0]]), (3, [shards[0]])]
    assert [s for s, _ in complete_checkpoints(job)] == [1, 2]
    root.write_bytes(f"{step_name(5)}/__0_0.distcp", b"in flight")  # no .metadata yet: not reported, not removed
    prune(job, keep=1)
    assert root.list() == [step_name(2), step_name(3), step_name(4), step_name(5)]  # newer than the kept one stay


def test_retries_report_each_attempt_then_give_up_by_name():
    calls, events = [], []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("refused")
        return "ok"

    assert with_retries(flaky, "checkpoint 7", 1, RetryPolicy(limit_s=60), events.append, sleep=lambda s: None) == "ok"
    assert [e.kind for e in events] == ["store_retry", "store_retry", "store_recovered"]
    assert [e.delay_s for e in events[:2]] == [0.5, 1.0] and events[2].retries == 2

    def down():
        raise ConnectionError("refused")

    with pytest.raises(StoreUnavailable, match=r"checkpoint 7: the storage did not answer .*TRAINYARD_STORE_RETRY_S=1"):
        with_retries(down, "checkpoint 7", 1, RetryPolicy(limit_s=1), events.append, sleep=lambda s: None)
    assert StoreUnavailable.retryable is False


def test_retry_limit_from_the_environment_is_checked(monkeypatch):
    monkeypatch.setenv("TRAINYARD_STORE_RETRY_S", "soon")
    with pytest.raises(ValueError, match="TRAINYARD_STORE_RETRY_S: not a number"):
        RetryPolicy.from_env()
    monkeypatch.setenv("TRAINYARD_STORE_RETRY_S", "7.5")
    assert RetryPolicy.from_env().limit_s == 7.5


# make test-all: make test keeps the job-level version (tests/service/test_store_jobs.py, store outage ridden out)
@pytest.mark.exhaustive
def test_a_save_rides_out_a_store_outage(s3_server, monkeypatch):
    bucket = s3_server.create_bucket(f"outage-{uuid.uuid4().hex[:8]}")
    forward = TcpForward(s3_server.port)
    monkeypatch.setenv("AWS_ENDPOINT_URL", forward.uri)  # the store as this process reaches it
    job = Storage.at(bucket + "/jobs/j")
    save(job, 1, 1.0)
    forward.go_down()  # the store goes away ...
    # longer than the client's own retries (botocore and s3fs absorb 5-20 s), so ours must carry it
    back = threading.Timer(30.0, forward.come_back)  # ... and comes back
    back.start()
    events: list = []
    started = time.monotonic()
    save(job, 2, 2.0, events, RetryPolicy(limit_s=60))
    back.join()
    assert time.monotonic() - started >= 29
    assert "store_retry" in [e.kind for e in events] and events[-1].kind == "store_recovered"
    assert latest_checkpoint(job)[0] == 2 and load(checkpoint_root(job) / step_name(2)) == 2.0
