"""Tracking files of a job on an object store (real S3 API): the MLflow run file is read back by a new
supervisor from the store, and TensorBoard event files written on the supervisor's node land in the store."""

from __future__ import annotations

import uuid

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from service.tracking import run_file
from service.tracking.background import BackgroundLogger
from service.tracking.records import step_metrics
from service.tracking.tensorboard_sink import TensorBoardSink
from workers.storage import Storage


def test_the_run_file_and_the_event_files_live_in_the_store(s3_server, tmp_path):
    job = Storage.at(s3_server.create_bucket(f"tracking-{uuid.uuid4().hex[:6]}")) / "jobs/j1"
    ref = run_file.MlflowRunRef("http://mlflow:5000", "1", "abc")
    run_file.save(job, ref)
    assert job.list() == ["tracking.json"] and run_file.load(job, "http://mlflow:5000") == ref
    assert run_file.load(job, "http://other:5000") is None
    sink = TensorBoardSink(job)
    logger = BackgroundLogger(sink, lambda e: None)
    for s in range(1, 6):
        logger.put(step_metrics({"step": s, "ts": 100.0 + s, "loss": 2.0 * s}))
    logger.close(30)
    assert sink.info() == {"logdir": job.url("tensorboard")} and not sink.logdir.exists()  # nothing kept on the node
    job.download("tensorboard", tmp_path / "tb")
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert {e.step: e.value for e in acc.Scalars("loss")} == {s: 2.0 * s for s in range(1, 6)}
