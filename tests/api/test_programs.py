"""The user's own training loop (`program:`) over REST on a real service and a real local Ray:
an unmodified torchrun script and a train function, with restarts, hangs, stragglers, cancel."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from api.cli.code_upload import zip_dir
from tests.helpers import alive_actors, wait_until
from tests.live import Server, wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SCRIPT_DIR = ROOT / "examples" / "torchrun-script"
FUNCTION_DIR = ROOT / "tests" / "fixtures" / "programs"
STEP_LOSS = re.compile(r"^step (\d+) loss (\S+)$", re.M)


@pytest.fixture(scope="module")
def server(tmp_path_factory, ray_cluster):
    home = tmp_path_factory.mktemp("programs")
    srv = Server(home, f"sqlite:///{home}/ty.db", ray_cluster.get_runtime_context().gcs_address).start()
    yield srv
    srv.stop()


def code_in_storage(srv: Server, src: Path) -> str:
    """The program's code where the service's storage root holds it (a path a tenant may name)."""
    dest = srv.home / "storage" / "code-src" / src.name
    if not dest.exists():
        shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__", "checkpoints"))
    return str(dest)


def submit(client: httpx.Client, spec: dict) -> dict:
    r = client.post("/v1/jobs", json=spec)
    assert r.status_code == 201, r.text
    return r.json()


def losses(client: httpx.Client, job_id: str) -> dict[int, float]:
    points = client.get(f"/v1/jobs/{job_id}/metrics").json()["points"]
    return {p["step"]: p["loss"] for p in points}


def job_dir(srv: Server, job_id: str) -> Path:
    return srv.home / "storage" / "jobs" / job_id


def uploaded(client: httpx.Client, src: Path) -> str:
    """The code reference of `src` zipped and uploaded, as a REST client ships a working_dir."""
    zipped = io.BytesIO()
    zip_dir(src, zipped, max_bytes=64 << 20)
    r = client.post("/v1/code", content=zipped.getvalue(), headers={"Content-Type": "application/zip"})
    assert r.status_code in (200, 201), r.text
    return r.json()["ref"]


def script_spec(working_dir: str, name: str, steps: int, **extra) -> dict:
    return {"name": name, "resources": {"workers": 2, "cpus_per_worker": 1},
            "program": {"command": ["python", "train.py", "--steps", str(steps), "--checkpoint-every", "5"],
                        "working_dir": working_dir}, **extra}


@pytest.fixture(scope="module")
def torchrun_reference(tmp_path_factory) -> tuple[dict[int, float], str]:
    """The same script under `torchrun --nproc-per-node 2`: its per-step losses and final parameters."""
    cwd = tmp_path_factory.mktemp("torchrun")
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          str(SCRIPT_DIR / "train.py"), "--steps", "12", "--checkpoint-every", "5"],
                         cwd=cwd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return ({int(s): float(v) for s, v in STEP_LOSS.findall(out.stdout)},
            (cwd / "checkpoints" / "final.sha256").read_text())


def test_torchrun_script_matches_torchrun_and_resumes_after_a_crash(server, torchrun_reference):
    ref_losses, ref_sha = torchrun_reference
    assert sorted(ref_losses) == list(range(1, 13))
    with server.client() as c:
        ref = uploaded(c, SCRIPT_DIR)
        assert ref.startswith("code:")
        clean = submit(c, script_spec(ref, "script", 12))
        crashed = submit(c, script_spec(code_in_storage(server, SCRIPT_DIR), "script-crash", 12,
                                        fault_injection=[{"at_step": 7, "rank": 1, "kind": "crash"}]))
        clean_job = wait_for(c, clean["id"], {"SUCCEEDED", "FAILED"}, timeout=240)
        assert clean_job["state"] == "SUCCEEDED", clean_job
        assert losses(c, clean["id"]) == ref_losses  # bit-identical on CPU gloo: the same script
        assert (job_dir(server, clean["id"]) / "checkpoints" / "final.sha256").read_text() == ref_sha
        # checkpoint.keep (2): only the two newest of step-5, step-10, step-12 are left.
        kept = sorted(p.name for p in (job_dir(server, clean["id"]) / "checkpoints").glob("step-*.pt"))
        assert kept == ["step-10.pt", "step-12.pt"]
        env = c.get(f"/v1/jobs/{clean['id']}/logs", params={"rank": 0}).text
        assert "started ['python', 'train.py'" in env
        assert "pre-started Python" in env  # torch already imported when the job came (prestarted.py)
        # Warm workers (torch imported) host the ranks' store in rank 0's actor, as torchrun's agent does.
        warm = int(re.search(r"\((\d+) from the warm pool\)",
                             (job_dir(server, clean["id"]) / "logs" / "supervisor.log").read_text()).group(1))
        hosts = {2: ["actor"], 0: ["program"]}.get(warm, ["actor", "program"])  # with 1, rank 0 may be either
        assert any(f"a TCP store hosted by rank 0's {h}" in env for h in hosts), (warm, env[-2000:])

        crashed_job = wait_for(c, crashed["id"], {"SUCCEEDED", "FAILED"}, timeout=240)
        assert crashed_job["state"] == "SUCCEEDED", crashed_job
        assert crashed_job["restarts"] == 1
        log = c.get(f"/v1/jobs/{crashed['id']}/logs", params={"rank": 0, "tail": 1000}).text
        assert "resumed from step-5.pt (restart 1)" in log  # TORCHELASTIC_RESTART_COUNT=1 on the 2nd attempt
        assert (job_dir(server, crashed["id"]) / "checkpoints" / "final.sha256").read_text() == ref_sha
        assert losses(c, crashed["id"]) == ref_losses
        restarts = [e for e in c.get(f"/v1/jobs/{crashed['id']}/events").json()["events"] if e["kind"] == "restart"]
        assert len(restarts) == 1, restarts
        assert "rank 1: python killed by signal 9" in restarts[0]["message"], restarts  # the crashed rank named


def function_spec(srv: Server, name: str, steps: int, sleep: float, **extra) -> dict:
    return {"name": name, "resources": {"workers": 4, "cpus_per_worker": 1}, "parallel": {"dp": 2, "tp": 2},
            "program": {"function": "mesh_train:train_func", "config": {"steps": steps, "sleep": sleep},
                        "working_dir": code_in_storage(srv, FUNCTION_DIR), "grace_period_s": 20}, **extra}


def test_function_gets_its_mesh_reports_metrics_and_stops_on_cancel(server):
    with server.client() as c:
        job = submit(c, function_spec(server, "mesh", 100_000, 0.05))
        deadline = time.monotonic() + 180
        while not (points := c.get(f"/v1/jobs/{job['id']}/metrics").json()["points"]):
            assert time.monotonic() < deadline, c.get(f"/v1/jobs/{job['id']}").json()
            time.sleep(0.3)
        mesh = json.loads((job_dir(server, job["id"]) / "checkpoints" / "mesh-trial0.json").read_text())
        assert mesh == {"shape": [2, 2], "names": ["dp", "tp"], "world_size": 4, "trial": 0}
        assert points[0]["accuracy"] == pytest.approx(points[0]["step"] / 100_000)  # a key of the program's own
        assert points[0]["loss"] is not None
        wait_until(lambda: f'trainyard_job_loss{{job="{job["id"]}"' in server.client().get("/metrics").text, 30)

        cancelled_at = time.monotonic()
        assert c.post(f"/v1/jobs/{job['id']}/cancel").status_code in (200, 202)
        done = wait_for(c, job["id"], {"CANCELLED", "FAILED", "SUCCEEDED"}, timeout=60)
        assert done["state"] == "CANCELLED"
        assert time.monotonic() - cancelled_at < 20 + 10  # within the grace period (and the poll)
        marks = (job_dir(server, job["id"]) / "checkpoints").glob("stopped-*")
        stopped = sorted(p.name.split("-step")[0] for p in marks)
        assert stopped == [f"stopped-rank{r}" for r in range(4)]  # every rank saw should_stop() and returned
    assert wait_until(lambda: not [a for a in alive_actors() if job["id"] in (a.get("Name") or "")
                                   and a["State"] != "DEAD"], 30)


@pytest.mark.exhaustive  # make test: the soak hangs program jobs and asserts each restarts (test_soak)
def test_hung_program_restarts_and_a_slow_rank_is_a_straggler(server):
    spec = function_spec(server, "mesh-faults", 30, 0.05,
                         fault_injection=[{"at_step": 2, "rank": 1, "kind": "slow", "factor": 6},
                                          {"at_step": 22, "rank": 0, "kind": "hang"}],
                         fault_tolerance={"max_restarts": 2, "hang_timeout_s": 4},
                         supervisor={"straggler": {"policy": "report", "window": 4}})
    with server.client() as c:
        job = submit(c, spec)
        done = wait_for(c, job["id"], {"SUCCEEDED", "FAILED", "CANCELLED"}, timeout=300)
        assert done["state"] == "SUCCEEDED", done
        events = c.get(f"/v1/jobs/{job['id']}/events").json()["events"]
        stragglers = [e for e in events if e["kind"] == "straggler"]
        assert stragglers and stragglers[0]["data"]["rank"] == 1, [e["kind"] for e in events]
        restarts = [e for e in events if e["kind"] == "restart"]
        assert [e["data"]["cause"] for e in restarts] == ["hang"]


@pytest.mark.parametrize("program, extra, field", [
    ({}, {}, "program.command"),
    ({"command": ["python", "train.py"]}, {"model": {"name": "gpt"}}, "model"),
    ({"command": ["python", "train.py"]}, {"train": {"steps": 5}}, "train"),
    ({"command": ["python", "train.py"], "env": {"RANK": "3"}}, {}, "program.env"),
    ({"command": ["python", "train.py"]}, {"supervisor": {"straggler": {"policy": "rebalance"}}},
     "supervisor.straggler.policy"),
])
def test_bad_program_specs_name_the_field_and_store_nothing(server, program, extra, field):
    with server.client() as c:
        before = len(c.get("/v1/jobs").json()["jobs"])
        r = c.post("/v1/jobs", json={"name": "bad", "resources": {"workers": 2}, "program": program, **extra})
        assert r.status_code == 422, r.text
        assert field in [e["field"] for e in r.json()["errors"]], r.json()
        assert len(c.get("/v1/jobs").json()["jobs"]) == before


def test_a_program_that_cannot_start_fails_at_once(server):
    with server.client() as c:
        # one rank each: failing at once is decided per rank, and each actor started costs seconds here
        bad_args = submit(c, {"name": "bad-args", "resources": {"workers": 1},
                              "program": {"command": ["python", "train.py", "--no-such-flag"],
                                          "working_dir": code_in_storage(server, SCRIPT_DIR)}})
        missing = submit(c, {"name": "no-module", "resources": {"workers": 1},
                             "program": {"function": "no_such_module:train",
                                         "working_dir": code_in_storage(server, FUNCTION_DIR)}})
        for job in (bad_args, missing):
            done = wait_for(c, job["id"], {"SUCCEEDED", "FAILED"}, timeout=180)
            assert done["state"] == "FAILED" and done["restarts"] == 0, done
        assert "exited with code 2" in wait_for(c, bad_args["id"], {"FAILED"})["error"]
        assert "ModuleNotFoundError" in wait_for(c, missing["id"], {"FAILED"})["error"]
