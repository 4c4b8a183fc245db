"""A real S3 API on the network for tests: moto's standalone server (HTTP, in its own process), which
s3fs and botocore talk to exactly as to S3 or MinIO. Its objects live in that process's memory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.live import free_port, wait_ready

ACCESS_KEY, SECRET_KEY, REGION = "trainyard-test", "trainyard-test-secret", "us-east-1"


class S3Server:
    """`moto.server` in its own process group, listening on `host` (loopback, or a bridge address that
    other network namespaces reach)."""

    def __init__(self, root: Path, host: str = "127.0.0.1", port: int | None = None):
        self.root, self.host, self.port = Path(root), host, port or free_port()
        self.endpoint = f"http://{host}:{self.port}"
        self.log = self.root / "s3-server.log"
        self.proc: subprocess.Popen | None = None

    @property
    def env(self) -> dict[str, str]:
        """The standard variables a client (the service, a rank) needs to reach this store."""
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_REGION": REGION, "AWS_DEFAULT_REGION": REGION}

    def start(self, timeout: float = 60) -> S3Server:
        self.root.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(self.port)]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_ready(self.proc, f"{self.endpoint}/moto-api/", self.log, "S3 server (moto)", timeout)
        except RuntimeError:
            self.stop()
            raise
        return self

    def create_bucket(self, name: str) -> str:
        """A new empty bucket; its URI."""
        import boto3

        client = boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                              aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY)
        client.create_bucket(Bucket=name)
        return f"s3://{name}"

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
