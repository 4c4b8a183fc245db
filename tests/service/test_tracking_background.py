"""The tracking queue on real MLflow clients: a port where no server listens (retries, then drops
with one event; never blocking the caller), a server that comes up during the backoff (delivered,
nothing dropped), and a real server (batched deliveries, the run continued by a second sink)."""

from __future__ import annotations

import time

from mlflow import MlflowClient

from service.tracking import run_file
from service.tracking.background import BackgroundLogger, QueueLimits, RetryPolicy
from service.tracking.mlflow_sink import MlflowSink
from service.tracking.records import RunEnd, StepMetrics
from tests.live import free_port
from tests.tcp_forward import TcpForward
from workers.events import TrackingDroppedEvent
from workers.spec import MlflowTrackingSpec

FAST_RETRY = RetryPolicy(retries=2, backoff_s=0.05)


def steps(first: int, last: int) -> list[StepMetrics]:
    return [StepMetrics(s, 1_700_000_000_000 + s, {"loss": 1.0 / s, "lr": 0.001}) for s in range(first, last + 1)]


def sink_for(uri: str, job_dir, experiment: str = "unit") -> MlflowSink:
    return MlflowSink(MlflowTrackingSpec(tracking_uri=uri, experiment=experiment), job_dir, "job0123456789",
                      "unit-job", {"train.steps": "20", "model.name": "gpt"})


class CountingSink(MlflowSink):
    """The real MLflow sink, counting its deliveries (each is one batch of records)."""

    sends = 0

    def send(self, batch):
        super().send(batch)
        self.sends += 1


def test_a_server_that_is_down_never_blocks_and_drops_with_one_event(tmp_path):
    events: list[TrackingDroppedEvent] = []
    logger = BackgroundLogger(sink_for(f"http://127.0.0.1:{free_port()}", tmp_path), events.append, FAST_RETRY,
                              QueueLimits(capacity=50, max_batch=10, linger_s=0.05))
    t0 = time.monotonic()
    accepted = [logger.put(item) for item in steps(1, 200)]
    assert time.monotonic() - t0 < 0.5, "put() must never wait for the server"
    assert not all(accepted), "a bounded queue refuses records once full"
    deadline = time.monotonic() + 30
    while not events and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(events) == 1 and events[0].sink == "mlflow", events
    assert "Connection" in events[0].error or "connect" in events[0].error.lower(), events[0].error
    t0 = time.monotonic()
    logger.close(10)
    assert time.monotonic() - t0 < 10
    assert logger.delivered == 0 and logger.dropped == 200
    # Drops after the outage's first report are reported once more, at close, with their steps.
    assert sum(e.dropped for e in events) == 200 and len(events) == 2, events
    assert events[0].steps is not None and events[0].steps[0] >= 1


def test_a_server_that_comes_up_during_the_backoff_gets_everything(tmp_path, mlflow_server):
    port = free_port()
    events: list[TrackingDroppedEvent] = []
    sink = CountingSink(MlflowTrackingSpec(tracking_uri=f"http://127.0.0.1:{port}", experiment="late"), tmp_path,
                        "job-late-0001", "late", {"a": "1"})
    logger = BackgroundLogger(sink, events.append, RetryPolicy(retries=6, backoff_s=0.2))
    for item in steps(1, 5):
        logger.put(item)
    time.sleep(0.5)  # the first tries are refused
    forward = TcpForward(mlflow_server.port, listen_port=port)
    try:
        logger.close(30)
    finally:
        forward.close()
    assert events == [] and logger.dropped == 0 and logger.delivered == 5
    history = MlflowClient(mlflow_server.uri).get_metric_history(sink.ref.run_id, "loss")
    assert [m.step for m in history] == [1, 2, 3, 4, 5]


def test_batches_reach_a_real_server_and_a_second_supervisor_continues_the_run(tmp_path, mlflow_server):
    model = tmp_path / "model.safetensors"
    model.write_bytes(b"not really a model")
    sink = CountingSink(MlflowTrackingSpec(tracking_uri=mlflow_server.uri, experiment="batches",
                                           tags={"team": "nlp"}), tmp_path, "job-batch-0001", "batch",
                        {"train.steps": "1500", "model.name": "gpt"})
    logger = BackgroundLogger(sink, lambda e: None, FAST_RETRY, QueueLimits(max_batch=500, linger_s=0.2))
    for item in steps(1, 1500):
        logger.put(item)
    logger.close(60)
    assert logger.delivered == 1500 and logger.dropped == 0
    assert sink.sends <= 6, f"1500 steps in {sink.sends} deliveries: not batched"
    client = MlflowClient(mlflow_server.uri)
    run_id = sink.ref.run_id
    run = client.get_run(run_id)
    assert run.data.params == {"train.steps": "1500", "model.name": "gpt"}
    assert run.data.tags["team"] == "nlp" and run.data.tags["trainyard.job_id"] == "job-batch-0001"
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == list(range(1, 1501))

    # A new supervisor of the same job (same job directory) continues that run, and ends it.
    assert run_file.load(tmp_path, mlflow_server.uri).run_id == run_id
    again = sink_for(mlflow_server.uri, tmp_path, experiment="batches")
    logger = BackgroundLogger(again, lambda e: None, FAST_RETRY)
    logger.put(steps(1501, 1501)[0])
    logger.put(RunEnd("FINISHED", (model,)))
    logger.close(60)
    assert again.ref.run_id == run_id and logger.dropped == 0
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["trainyard.supervisors"] == "2"
    assert len(client.search_runs([run.info.experiment_id])) == 1
    assert client.get_metric_history(run_id, "loss")[-1].step == 1501
    assert [a.path for a in client.list_artifacts(run_id)] == ["model.safetensors"]
