"""Experiment tracking over REST on a real service, a real local Ray and a real MLflow server:
a job with both sinks and an injected crash keeps one MLflow run whose series equal the REST ones
(and so do its TensorBoard files); a program job whose MLflow server goes away mid-run succeeds,
says what was dropped, and still writes every step to TensorBoard."""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from mlflow import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.helpers import tiny_spec
from tests.live import Server, states_of, wait_for
from tests.tcp_forward import TcpForward

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SERIES = ("loss", "lr", "grad_norm", "samples_per_s", "tokens_per_s", "step_time_s")


@pytest.fixture(scope="module")
def server(tmp_path_factory, ray_cluster, request):
    home = tmp_path_factory.mktemp("tracking")
    srv = Server(home, f"sqlite:///{home}/ty.db", ray_cluster.get_runtime_context().gcs_address)
    with ThreadPoolExecutor(1) as pool:  # the service starts while the session's MLflow server does
        started = pool.submit(srv.start)
        request.getfixturevalue("mlflow_server")
        started.result()
    yield srv
    srv.stop()


def rest_points(c, job_id: str) -> dict[int, dict]:
    return {p["step"]: p for p in c.get(f"/v1/jobs/{job_id}/metrics").json()["points"]}


def newest_per_step(history) -> dict[int, float]:
    """A step logged again after a restart (replayed from the checkpoint): its newest value counts."""
    out: dict[int, float] = {}
    for m in sorted(history, key=lambda m: m.timestamp):
        out[m.step] = m.value
    return out


def tensorboard_series(logdir: str, tag: str) -> dict[int, float]:
    acc = EventAccumulator(logdir)
    acc.Reload()
    out: dict[int, float] = {}
    for event in acc.Scalars(tag):
        out[event.step] = event.value
    return out


def test_crash_restart_logs_one_mlflow_run_equal_to_rest_and_tensorboard_files(server, mlflow_server):
    tracking = {"mlflow": {"tracking_uri": mlflow_server.uri, "experiment": "llama-sweeps", "run_name": None,
                           "tags": {"team": "nlp"}}, "tensorboard": True}
    spec = tiny_spec(**{"name": "tracked", "resources.workers": 2, "train.steps": 30, "train.eval_every": 10,
                        "checkpoint.every_steps": 10, "tracking": tracking,
                        "fault_injection": [{"at_step": 15, "rank": 1, "kind": "crash"}]})
    with server.client() as c:
        resp = c.post("/v1/jobs", json=spec)
        assert resp.status_code == 201, resp.text
        job = wait_for(c, resp.json()["id"], {"SUCCEEDED", "FAILED", "CANCELLED"})
        assert job["state"] == "SUCCEEDED" and job["restarts"] == 1, job
        points = rest_points(c, job["id"])
        events = c.get(f"/v1/jobs/{job['id']}/events").json()["events"]
    kinds = [e["kind"] for e in events]
    assert states_of(events) == ["QUEUED", "STARTING", "RUNNING", "RECOVERING", "RUNNING", "SUCCEEDED"]
    restart = next(e for e in events if e["kind"] == "restart")
    # resumes from the last checkpoint that was complete when rank 1 died (the async save at 10, or none)
    assert restart["data"]["resume_step"] in (0, 10) and "rank 1" in restart["message"]
    assert restart["data"]["cause"] == "worker_lost"  # its node lives on: the job's own restart budget
    assert sorted(points) == list(range(1, 31))  # replayed steps replaced, not duplicated
    assert "tracking_dropped" not in kinds

    run_id = job["tracking"]["mlflow"]["run_id"]
    client = MlflowClient(mlflow_server.uri)
    runs = client.search_runs([job["tracking"]["mlflow"]["experiment_id"]],
                              filter_string=f"tags.`trainyard.job_id` = '{job['id']}'")
    assert [r.info.run_id for r in runs] == [run_id], "a crash-restart continues the job's one run"
    run = runs[0]
    assert run.info.status == "FINISHED" and run.info.run_name.startswith("tracked-")
    assert run.data.tags["team"] == "nlp" and run.data.tags["trainyard.restarts"] == "1"
    assert run.data.tags["trainyard.supervisors"] == "1"  # a restart inside the supervisor keeps its sinks
    assert run.data.params["train.steps"] == "30" and run.data.params["resources.workers"] == "2"
    assert run.data.params["fault_injection"].startswith('[{"at_step": 15')
    for key in SERIES:
        logged = newest_per_step(client.get_metric_history(run_id, key))
        assert logged == {s: pytest.approx(p[key], rel=1e-12) for s, p in points.items()}, key
    assert sorted(newest_per_step(client.get_metric_history(run_id, "val_loss"))) == [10, 20, 30]
    assert [a.path for a in client.list_artifacts(run_id)] == ["model.safetensors"]
    exported = Path(job["summary"]["export_path"])
    downloaded = Path(client.download_artifacts(run_id, "model.safetensors", str(server.home / "dl")))
    assert downloaded.read_bytes() == exported.read_bytes()

    logdir = job["tracking"]["tensorboard"]["logdir"]
    assert Path(logdir) == server.home / "storage" / "jobs" / job["id"] / "tensorboard"
    for key in ("loss", "lr", "samples_per_s"):  # TensorBoard keeps float32
        assert tensorboard_series(logdir, key) == {s: pytest.approx(p[key], rel=1e-6) for s, p in points.items()}


@pytest.mark.exhaustive  # make test: MLflow and TensorBoard through a crash restart (the test above)
def test_a_tracking_server_that_goes_away_mid_run_does_not_fail_a_program_job(server, mlflow_server):
    code = server.home / "storage" / "code-src" / "programs"
    shutil.copytree(ROOT / "tests" / "fixtures" / "programs", code, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    forward = TcpForward(mlflow_server.port)  # the job's way to the server, closed mid-run
    steps = 80  # 0.1 s each: the cut comes well before the end
    spec = {"name": "outage", "resources": {"workers": 2, "cpus_per_worker": 1}, "parallel": {"dp": 2},
            "program": {"function": "mesh_train:train_func", "config": {"steps": steps, "sleep": 0.1},
                        "working_dir": str(code)},
            "tracking": {"mlflow": {"tracking_uri": forward.uri, "experiment": "outage"}, "tensorboard": True}}
    client = MlflowClient(mlflow_server.uri)
    try:
        with server.client() as c:
            resp = c.post("/v1/jobs", json=spec)
            assert resp.status_code == 201, resp.text
            job_id = resp.json()["id"]
            deadline = time.monotonic() + 120
            while not (job := c.get(f"/v1/jobs/{job_id}").json()).get("tracking", {}) \
                    or not (run_id := job["tracking"]["mlflow"]["run_id"]) \
                    or not client.get_metric_history(run_id, "loss"):
                assert time.monotonic() < deadline and job["state"] not in ("SUCCEEDED", "FAILED"), job
                time.sleep(0.2)
            forward.close()
            cut_at = c.get(f"/v1/jobs/{job_id}").json()["step"]
            assert cut_at < steps - 10, "the server must go away mid-run"
            job = wait_for(c, job_id, {"SUCCEEDED", "FAILED", "CANCELLED"})
            events = c.get(f"/v1/jobs/{job_id}/events").json()["events"]
            points = rest_points(c, job_id)
    finally:
        forward.close()
    assert job["state"] == "SUCCEEDED", job
    assert sorted(points) == list(range(1, steps + 1))
    dropped = [e for e in events if e["kind"] == "tracking_dropped"]
    assert dropped and dropped[0]["data"]["sink"] == "mlflow" and dropped[0]["data"]["dropped"] > 0, dropped
    assert "mlflow logging dropped" in dropped[0]["message"]
    logged = newest_per_step(client.get_metric_history(run_id, "accuracy"))  # the program's own key
    assert 1 <= len(logged) < steps
    assert logged == {s: pytest.approx(points[s]["accuracy"]) for s in logged}
    assert client.get_run(run_id).info.status == "RUNNING"  # its end went down with the server
    # TensorBoard is local: every step is there, the program's own keys too.
    logdir = job["tracking"]["tensorboard"]["logdir"]
    assert tensorboard_series(logdir, "accuracy") == {s: pytest.approx(p["accuracy"], rel=1e-6)
                                                      for s, p in points.items()}
