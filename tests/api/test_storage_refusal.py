"""`trainyard serve` refuses a TRAINYARD_STORAGE_URI it cannot write to, by name and with the cause,
before it creates anything (service/storage_check.py), against a real S3 API (moto's server over HTTP)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.live import free_port

NO_CREDENTIALS = {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None, "AWS_SESSION_TOKEN": None,
                  "AWS_PROFILE": None, "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
                  "AWS_CONFIG_FILE": "/nonexistent", "AWS_EC2_METADATA_DISABLED": "true"}


@pytest.mark.parametrize("case, cause", [
    ("no such bucket", "no such bucket"),
    pytest.param("unreachable endpoint", "unreachable endpoint", marks=pytest.mark.exhaustive),  # ~14 s of timeouts
    ("no credentials", "no credentials"),
])
def test_a_store_the_service_cannot_write_to_is_refused_at_start_up(s3_server, tmp_path, case, cause):
    bucket = s3_server.create_bucket("refusal-exists")
    env: dict[str, str | None] = {**os.environ, **s3_server.env, "TRAINYARD_HOME": str(tmp_path),
                                  "TRAINYARD_STORAGE_URI": f"{bucket}/prefix"}
    if case == "no such bucket":
        env["TRAINYARD_STORAGE_URI"] = "s3://no-such-bucket/prefix"
    elif case == "unreachable endpoint":
        env["AWS_ENDPOINT_URL"] = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    else:
        env.update(NO_CREDENTIALS)
    script = str(Path(sys.executable).with_name("trainyard"))
    r = subprocess.run([script, "serve"], env={k: v for k, v in env.items() if v is not None},
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    line = " ".join(r.stderr.split())  # rich wraps nothing (soft_wrap), but be safe
    assert "invalid setting TRAINYARD_STORAGE_URI: cannot write to s3://" in line and cause in line, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "trainyard.db").exists()


def test_a_writable_store_leaves_no_probe_behind(s3_server):
    from service.storage_check import storage_problem
    from workers.storage import Storage

    store = Storage.at(s3_server.create_bucket("refusal-ok") + "/prefix")
    assert storage_problem(store) is None and store.list() == []
