"""A real Google Cloud Storage JSON API on loopback for tests: gcp-storage-emulator's server (HTTP, in
its own process, objects in its memory), which gcsfs talks to as to GCS when STORAGE_EMULATOR_HOST
names it (the variable Google's own clients read)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx

from tests.live import free_port, wait_ready


class GcsServer:
    def __init__(self, root: Path, host: str = "127.0.0.1"):
        self.root, self.host, self.port = Path(root), host, free_port()
        self.endpoint = f"http://{host}:{self.port}"
        self.log = self.root / "gcs-server.log"
        self.proc: subprocess.Popen | None = None

    @property
    def env(self) -> dict[str, str]:
        """What a client (the service, a rank) needs to reach this store."""
        return {"STORAGE_EMULATOR_HOST": self.endpoint}

    def start(self, timeout: float = 60) -> GcsServer:
        self.root.mkdir(parents=True, exist_ok=True)
        emulator = Path(sys.executable).parent / "gcp-storage-emulator"
        cmd = [str(emulator), "start", "-H", self.host, "--port", str(self.port), "--in-memory", "--quiet"]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_ready(self.proc, f"{self.endpoint}/storage/v1/b?project=trainyard", self.log, "GCS server", timeout)
        except RuntimeError:
            self.stop()
            raise
        return self

    def create_bucket(self, name: str) -> str:
        """A new empty bucket; its URI."""
        resp = httpx.post(f"{self.endpoint}/storage/v1/b", params={"project": "trainyard"}, json={"name": name})
        resp.raise_for_status()
        return f"gs://{name}"

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
