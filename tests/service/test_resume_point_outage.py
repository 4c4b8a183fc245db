"""A supervisor reads its job's resume point from the store the ranks write to: when a rank failed because
the store went away, the supervisor's read must ride out the same outage (retried, each retry an event)
instead of crashing the supervisor, and give up with the store's cause past TRAINYARD_STORE_RETRY_S."""

from __future__ import annotations

import threading
import uuid

import pytest
import torch
import torch.distributed.checkpoint as dcp

from service.supervisor.resume_point import resume_step_riding_outages
from tests.tcp_forward import TcpForward
from workers.checkpointing import RetryPolicy, StoreUnavailable, checkpoint_root, step_name
from workers.checkpointing.writer import writer_for
from workers.storage import Storage


@pytest.fixture
def job_behind_a_forward(s3_server, monkeypatch):
    forward = TcpForward(s3_server.port)
    monkeypatch.setenv("AWS_ENDPOINT_URL", forward.uri)  # the store as the supervisor's process reaches it
    job = Storage.at(s3_server.create_bucket(f"resume-{uuid.uuid4().hex[:8]}") + "/jobs/j")
    dcp.save({"w": torch.ones(4), "progress": {"step": 4}},
             storage_writer=writer_for(checkpoint_root(job) / step_name(4), "checkpoint 4", 0, RetryPolicy(),
                                       lambda event: None))
    yield forward, job
    forward.close()


def test_the_resume_point_is_read_through_a_store_outage(job_behind_a_forward):
    forward, job = job_behind_a_forward
    forward.go_down()
    events: list = []

    def notify(event) -> None:
        # The store comes back only once a listing has failed: one try rides out several seconds of refusals
        # inside the S3 client's own retries, so a fixed-length outage can end before the supervisor sees it.
        if not events:
            threading.Timer(1.0, forward.come_back).start()
        events.append(event)

    assert resume_step_riding_outages(job, False, notify, RetryPolicy(limit_s=60)) == 4
    kinds = [e.kind for e in events]
    assert kinds[0] == "store_retry" and kinds[-1] == "store_recovered", kinds
    assert events[0].message.startswith("the supervisor: listing checkpoints failed"), events[0].message


@pytest.mark.exhaustive  # 23 s of a store refusing; make test keeps the outage ridden out
def test_a_store_gone_past_the_limit_names_the_setting(job_behind_a_forward):
    forward, job = job_behind_a_forward
    forward.go_down()
    events: list = []
    with pytest.raises(StoreUnavailable, match="TRAINYARD_STORE_RETRY_S=20"):
        resume_step_riding_outages(job, False, events.append, RetryPolicy(limit_s=20))  # > one listing try (~10 s)
    assert events and all(e.kind == "store_retry" for e in events)
