"""A real MLflow tracking server on loopback (SQLite backend store, proxied artifacts), and a TCP
forwarder in front of it that a test can close to take "the server" away from one job only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.live import free_port, wait_ready


class MlflowServer:
    """`mlflow server` in its own process group, on a free port."""

    def __init__(self, root: Path):
        self.root, self.port = Path(root), free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.log = self.root / "mlflow-server.log"

    def start(self, timeout: float = 240) -> MlflowServer:
        self.root.mkdir(parents=True, exist_ok=True)
        mlflow = Path(sys.executable).parent / "mlflow"
        cmd = [str(mlflow), "server", "--backend-store-uri", f"sqlite:///{self.root}/mlflow.db",
               "--artifacts-destination", str(self.root / "artifacts"), "--host", "127.0.0.1",
               "--port", str(self.port), "--workers", "1"]
        # The server's background job runner (GenAI scoring) is not what these tests exercise.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            wait_ready(self.proc, f"{self.uri}/health", self.log, "mlflow server", timeout)
        except RuntimeError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)  # the server and the uvicorn process it started
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
