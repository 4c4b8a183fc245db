"""The CLI against a live embedded service: the generated admin token (0600) is picked up,
tables are printed, and failures exit non-zero."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import tiny_spec
from tests.live import Server


@pytest.fixture(scope="module")
def embedded(tmp_path_factory, ray_address):
    home = tmp_path_factory.mktemp("cli-home")
    srv = Server(home, "", ray_address, TRAINYARD_ADMIN_TOKEN="", TRAINYARD_SCHEDULER_ENABLED="false").start()
    yield srv
    srv.stop()


def cli(srv: Server, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TRAINYARD_TOKEN", "TRAINYARD_ADMIN_TOKEN")}
    env |= {"TRAINYARD_HOME": str(srv.home), "TRAINYARD_URL": srv.url, "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "api.cli", *args], env=env, capture_output=True, text=True, timeout=60)


def test_embedded_mode_writes_a_private_admin_token(embedded):
    token_file = embedded.home / "admin-token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert (embedded.home / "trainyard.db").exists()  # SQLite under TRAINYARD_HOME by default


def test_submit_list_get_events_cancel(embedded, tmp_path):
    spec_path = tmp_path / "job.yaml"
    spec_path.write_text(yaml.safe_dump(tiny_spec(name="cli-job")))
    out = cli(embedded, "submit", str(spec_path), "--json")
    assert out.returncode == 0, out.stderr
    job = json.loads(out.stdout)
    assert job["state"] == "QUEUED"

    listed = cli(embedded, "list")
    assert listed.returncode == 0 and job["id"] in listed.stdout and "QUEUED" in listed.stdout
    got = cli(embedded, "get", job["id"])
    assert got.returncode == 0 and "cli-job" in got.stdout and "total_steps" in got.stdout
    cancelled = cli(embedded, "cancel", job["id"])
    assert cancelled.returncode == 0 and "CANCELLED" in cancelled.stdout
    events = cli(embedded, "events", job["id"])
    assert events.returncode == 0 and "QUEUED" in events.stdout and "CANCELLED" in events.stdout


def test_failures_exit_non_zero_with_the_reason(embedded, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(tiny_spec(**{"parallel.dp": 3})))
    out = cli(embedded, "submit", str(bad))
    assert out.returncode == 2 and "dp x tp x pp must equal resources.workers" in out.stderr
    missing = cli(embedded, "get", "no-such-job")
    assert missing.returncode == 1 and "404" in missing.stderr and "not found" in missing.stderr
    unreadable = cli(embedded, "submit", str(tmp_path / "absent.yaml"))
    assert unreadable.returncode == 2
    env_down = cli(Server(embedded.home, ""), "list")  # nothing listens on that port
    assert env_down.returncode == 1 and "cannot reach the service" in env_down.stderr


@pytest.mark.parametrize("variable, value, rule", [
    ("TRAINYARD_API_WORKERS", "0", "Input should be greater than or equal to 1"),
    ("TRAINYARD_API_THREADS", "-2", "Input should be greater than or equal to 1"),
    ("TRAINYARD_PORT", "eighty", "Input should be a valid integer"),
    ("TRAINYARD_STORAGE_URI", "ftp://host/trainyard", "ftp:// is not a supported storage scheme"),
    ("TRAINYARD_STORAGE_URI", "s3:///trainyard", "names no bucket"),
])
@pytest.mark.parametrize("command", [["serve"], ["list"]])
def test_an_invalid_setting_is_refused_by_name(tmp_path, variable, value, rule, command):
    """By `serve` before it creates anything, and by a client command (which reads the settings
    for the stored admin token), through the installed `trainyard` script."""
    env = {**os.environ, "TRAINYARD_HOME": str(tmp_path), "TRAINYARD_URL": "http://127.0.0.1:1", variable: value}
    env.pop("TRAINYARD_TOKEN", None)
    script = str(Path(sys.executable).with_name("trainyard"))
    r = subprocess.run([script, *command], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"invalid setting {variable}: " in r.stderr and rule in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "trainyard.db").exists()  # refused before anything was created
