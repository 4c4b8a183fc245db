"""The actor's end of a command rank's session (trainyard/channel.py): a Unix socket that takes
batches of reports and says whether to stop (in every answer), served from its own thread while the
rank runs."""

from __future__ import annotations

import json
import os
import socket
import tempfile
import threading
import time
from pathlib import Path

from workers.program.reports import ReportSink

DRAIN_S = 2.0  # how long a closing session waits for the rank's last line


class SessionServer:
    def __init__(self, sink: ReportSink, stop: threading.Event):
        self.sink, self.stop = sink, stop
        # Short and private: a Unix socket path has ~100 bytes; the directory is this process's own.
        self._dir = Path(tempfile.mkdtemp(prefix="ty-"))
        self.path = str(self._dir / "s")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.path)
        self._sock.listen(8)
        self._closed = False
        self._serving: list[threading.Thread] = []
        threading.Thread(target=self._accept, name="trainyard-session", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            serving = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._serving.append(serving)
            serving.start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn, conn.makefile("rwb") as stream:
                for line in stream:
                    try:
                        request = json.loads(line)
                        answer = self._answer(request)
                    except (ValueError, KeyError, TypeError) as exc:
                        answer = {"error": f"{type(exc).__name__}: {exc}"}
                    stream.write(json.dumps(answer).encode() + b"\n")
                    stream.flush()
        except OSError:
            pass  # the rank's process went (killed, or ended mid-exchange): the group's exit says why

    def _answer(self, request: dict) -> dict:
        op = request["op"]
        if op == "report":
            for r in request["reports"]:
                self.sink.report(dict(r["metrics"]), r.get("step"), wall_s=float(r["wall_s"]), own_s=float(r["own_s"]))
        elif op != "should_stop":
            raise ValueError(f"unknown op {op!r}")
        return {"stop": self.stop.is_set()}  # every answer says whether to stop

    def close(self, drain_s: float = DRAIN_S) -> None:
        """After the rank's process ended: take the last line it sent (its final reports, sent at exit),
        waiting at most drain_s, then remove the socket."""
        self._closed = True
        deadline = time.monotonic() + drain_s
        for serving in list(self._serving):
            serving.join(timeout=max(0.0, deadline - time.monotonic()))
        try:
            self._sock.close()
            os.unlink(self.path)
            self._dir.rmdir()
        except OSError:
            pass
