"""A command rank's line to its actor: newline-delimited JSON over a Unix socket, one request at
a time. The actor answers a report only once it has taken it in (or, under an injected `slow` or
`hang` fault, later), so a report is also where the supervisor can hold a rank."""

from __future__ import annotations

import json
import socket
import threading


class SocketSession:
    def __init__(self, path: str):
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(path)
        self._file = self._sock.makefile("rwb")
        self._lock = threading.Lock()

    def _ask(self, request: dict) -> dict:
        with self._lock:
            self._file.write(json.dumps(request).encode() + b"\n")
            self._file.flush()
            line = self._file.readline()
        if not line:
            raise ConnectionError("trainyard: the rank's supervisor went away")
        return json.loads(line)

    def report(self, metrics: dict[str, float], step: int | None) -> None:
        self._ask({"op": "report", "metrics": metrics, "step": step})

    def should_stop(self) -> bool:
        return bool(self._ask({"op": "should_stop"})["stop"])
