"""A real MLflow tracking server on loopback (SQLite backend store, proxied artifacts), and a TCP
forwarder in front of it that a test can close to take "the server" away from one job only."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
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


class TcpForward:
    """127.0.0.1:<port> -> target port, byte for byte. close() refuses new connections and cuts open
    ones: to a client it is a tracking server that went down."""

    def __init__(self, target_port: int, listen_port: int = 0):
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", listen_port))
        self.port = self._listener.getsockname()[1]
        self.uri = f"http://127.0.0.1:{self.port}"
        self._open: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        # shutdown() first: a plain close() leaves the socket listening while accept() blocks on it.
        for s in (self._listener, *self._open):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
