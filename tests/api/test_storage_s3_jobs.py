"""Jobs trained through a real `trainyard serve` on an S3 store (moto over HTTP), scheduler on: logs
follow while the job runs and after it ended, the model downloads from the store, and a program job
runs code uploaded to the store. Needs the store branch (job files on Storage) and the logs branch."""

from __future__ import annotations

import hashlib
import io
import threading
import time
import uuid
import zipfile

import pytest

from tests.db_fixtures import make_db_url
from tests.helpers import tiny_spec
from tests.live import TERMINAL, Server, wait_for
from workers.storage import Storage


@pytest.fixture(scope="module")
def root(s3_server) -> Storage:
    return Storage.at(s3_server.create_bucket(f"jobs-{uuid.uuid4().hex[:8]}") + "/prefix")


@pytest.fixture(scope="module")
def server(tmp_path_factory, ray_address, s3_server, root):
    home = tmp_path_factory.mktemp("s3-jobs")
    url, _ = make_db_url("sqlite", home)
    server = Server(home, url, ray_address, TRAINYARD_STANDBY_SUPERVISORS="0", TRAINYARD_WARM_WORKERS="0",
                    TRAINYARD_STORAGE_URI=root.uri, **s3_server.env).start()
    yield server
    server.stop()
    assert not (home / "storage").exists()


def test_a_job_on_the_store_logs_follow_and_the_model_downloads(server, root):
    with server.client() as c:
        # Rank 0 hangs at step 30 until the supervisor's 10 s hang timeout restarts it from step 20:
        # the job is still running then, however fast the host, so the follower must have read the
        # first process's lines by that time; the restarted process's log continues the same stream.
        job = c.post("/v1/jobs", json=tiny_spec(**{
            "train.steps": 60, "checkpoint.every_steps": 20,
            "fault_tolerance": {"hang_timeout_s": 10, "max_restarts": 1},
            "fault_injection": [{"at_step": 30, "rank": 0, "kind": "hang"}]})).json()
        lines: list[tuple[float, str, str]] = []

        def follow():
            with server.client() as f, f.stream("GET", f"/v1/jobs/{job['id']}/logs?rank=0&follow=true",
                                                timeout=600) as resp:
                for line in resp.iter_lines():
                    state = c.get(f"/v1/jobs/{job['id']}").json()["state"] if "ready at step" in line else ""
                    lines.append((time.monotonic(), line, state))

        t = threading.Thread(target=follow, daemon=True)
        t.start()
        done = wait_for(c, job["id"], TERMINAL, timeout=600)
        assert done["state"] == "SUCCEEDED", done
        t.join(60)
        assert not t.is_alive(), "the follow stream did not end with the job"
        ready = [state for _, line, state in lines if "ready at step 0" in line]
        assert ready and ready[0] not in TERMINAL, lines[:5]  # streamed while the job ran
        resumed = [line for _, line, _ in lines if "ready at step 20" in line]
        assert resumed, [line for _, line, _ in lines][-10:]  # the restarted rank's log, same stream
        assert any("finished" in line for _, line, _ in lines), lines[-5:]
        after = c.get(f"/v1/jobs/{job['id']}/logs", params={"rank": 0, "tail": 5, "follow": True}).text
        assert "finished" in after
        assert "SUCCEEDED" in c.get(f"/v1/jobs/{job['id']}/logs", params={"rank": "supervisor"}).text
        model = c.get(f"/v1/jobs/{job['id']}/checkpoints/model")
        stored = (root / f"jobs/{job['id']}").read_bytes("model.safetensors")
        assert model.status_code == 200 and model.content == stored
        listed = c.get(f"/v1/jobs/{job['id']}/checkpoints").json()
        assert listed["model"]["available"] and any(cp["available"] for cp in listed["checkpoints"]), listed


def test_a_program_runs_code_uploaded_to_the_store(server, root):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("train.py", "import os\nprint('hello from', os.environ['RANK'], flush=True)\n")
    data = buf.getvalue()
    with server.client() as c:
        ref = c.post("/v1/code", content=data, headers={"Content-Type": "application/zip"}).json()["ref"]
        assert root.exists(f"code/{hashlib.sha256(data).hexdigest()}.zip")
        job = c.post("/v1/jobs", json={"name": "prog", "program": {"command": ["python", "train.py"],
                                                                   "working_dir": ref},
                                       "resources": {"workers": 2}}).json()
        done = wait_for(c, job["id"], TERMINAL, timeout=600)
        assert done["state"] == "SUCCEEDED", done
        for rank in (0, 1):
            assert f"hello from {rank}" in c.get(f"/v1/jobs/{job['id']}/logs", params={"rank": rank}).text
