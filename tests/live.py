"""Live control-plane helpers for tests: databases on SQLite and PostgreSQL, real `trainyard serve` processes."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

PG_SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
ADMIN_TOKEN = "ty_test_admin_" + uuid.uuid4().hex
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def pg_schema_url(schema: str) -> str:
    return f"{PG_SERVER}?options=-csearch_path%3D{schema}"


def create_pg_schema() -> str:
    """A fresh schema in the `test` database. PostgreSQL unreachable is a failure, never a skip."""
    import psycopg

    schema = "ty_" + uuid.uuid4().hex[:12]
    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/test", autocommit=True, connect_timeout=5) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    return schema


def drop_pg_schema(schema: str) -> None:
    import psycopg

    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/test", autocommit=True, connect_timeout=5) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def wait_ready(proc: subprocess.Popen, url: str, log: Path, name: str, timeout: float) -> None:
    """Until `url` answers 200: a test server is up. Its exit or the deadline is an error with the end of its log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{name} not ready in {timeout}s:\n{log.read_text()[-3000:]}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One real `trainyard serve` process (uvicorn) on a free port."""

    def __init__(self, home: Path, database_url: str, ray_address: str = "", *serve_args: str, **env: str):
        self.home, self.port, self.serve_args = Path(home), free_port(), serve_args
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "TRAINYARD_HOME": str(home), "TRAINYARD_DATABASE_URL": database_url,
                    "TRAINYARD_RAY_ADDRESS": ray_address, "TRAINYARD_PORT": str(self.port),
                    "TRAINYARD_ADMIN_TOKEN": ADMIN_TOKEN, "TRAINYARD_ALLOW_FAULT_INJECTION": "1",
                    "TRAINYARD_LOOP_INTERVAL_S": "0.2", **env}
        self.proc: subprocess.Popen | None = None
        self.log = self.home / "serve.log"

    def start(self, timeout: float = 90) -> "Server":
        self.home.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "api.cli", "serve", *self.serve_args], env=self.env,
                                         stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).parent.parent)
        wait_ready(self.proc, f"{self.url}/readyz", self.log, "trainyard serve", timeout)
        return self

    def kill(self) -> None:
        """SIGKILL: the control plane dies without any clean-up."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def client(self, token: str = ADMIN_TOKEN) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)


def wait_for(client: httpx.Client, job_id: str, states: set[str], timeout: float = 180) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["state"] in states:
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} not in {states} after {timeout}s: {job}")


def wait_step(client: httpx.Client, job_id: str, step: int, timeout: float = 180) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").json()
        if job["step"] >= step or job["state"] in TERMINAL:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not reach step {step} in {timeout}s: {job}")


def states_of(events: list[dict]) -> list[str]:
    return [e["state"] for e in events if e["kind"] == "state"]
