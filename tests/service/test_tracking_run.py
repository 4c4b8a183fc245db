"""The real JobRun (scripted worker groups, no Ray) with both tracking sinks: restarts and resizes
reach MLflow as tags and TensorBoard as series, every step's newest values equal the run's own
records, a preempted run stays RUNNING for its next supervisor, and the summary names the run."""

from __future__ import annotations

import pytest
from mlflow import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.helpers import spec_of
from tests.service.supervisor_fakes import AttemptScript, FakeCluster, Script
from tests.service.test_supervisor_step import Recorder, scripted_run


def test_a_run_with_a_crash_a_resize_and_a_preemption_is_tracked(tmp_path, mlflow_server):
    spec = spec_of(**{"name": "scripted", "resources.workers": 4, "resources.min_workers": 2, "train.steps": 30,
                      "checkpoint.every_steps": 2,
                      "tracking": {"mlflow": {"tracking_uri": mlflow_server.uri, "experiment": "scripted",
                                              "tags": {"team": "nlp"}}, "tensorboard": True}})
    cluster = FakeCluster({"node-a": 2, "node-b": 2})
    script = Script([AttemptScript(fail_at=5), AttemptScript(fail_at=9, lose_node="node-b"), AttemptScript()],
                    total_steps=30)
    rec = Recorder()
    run = scripted_run(tmp_path, spec, script, cluster, rec)
    rec.on_step_hook = lambda record: run.preempt("high") if record["step"] == 14 else None

    summary = run.run()

    assert summary["state"] == "QUEUED" and summary["restarts"] == 2 and summary["resizes"] == 1
    assert rec.of("tracking_dropped") == []
    run_id = summary["tracking"]["mlflow"]["run_id"]
    assert summary["tracking"]["tensorboard"]["logdir"] == str(tmp_path / "tensorboard")
    client = MlflowClient(mlflow_server.uri)
    mlflow_run = client.get_run(run_id)
    assert mlflow_run.info.status == "RUNNING", "a preempted job's next supervisor continues the run"
    tags = mlflow_run.data.tags
    assert (tags["trainyard.restarts"], tags["trainyard.resizes"], tags["trainyard.state"]) == ("2", "1", "QUEUED")
    assert tags["team"] == "nlp" and tags["trainyard.job_id"] == "j"
    assert mlflow_run.data.params["resources.min_workers"] == "2"
    newest = {m.step: m.value for m in sorted(client.get_metric_history(run_id, "loss"), key=lambda m: m.timestamp)}
    assert newest == {s["step"]: s["loss"] for s in run.steps}
    assert [m.value for m in client.get_metric_history(run_id, "world_size")] == [2.0]

    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [e.value for e in acc.Scalars("restarts")] == [1.0, 2.0]
    assert {e.step: e.value for e in acc.Scalars("lr")} == {s["step"]: pytest.approx(s["lr"], rel=1e-6)
                                                           for s in run.steps}  # TensorBoard keeps float32
