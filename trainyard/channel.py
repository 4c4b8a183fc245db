"""A command rank's line to its actor: newline-delimited JSON over a Unix socket.

Reports are pipelined: `report` writes its line and returns; the actor's answer (which also says
whether the rank should stop) is read at the next report, by when it has long arrived, and
`should_stop` answers from the last answer read while that is under STOP_FRESH_S old. A step
therefore costs one write and one read of a waiting line, not a round trip. An injected `slow` or
`hang` fault holds the answer, so the rank is held at its next call.
"""

from __future__ import annotations

import json
import socket
import threading
import time

STOP_FRESH_S = 1.0  # a stop flag answered this recently is current enough for should_stop()


class SocketSession:
    def __init__(self, path: str):
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(path)
        self._file = self._sock.makefile("rwb")
        self._lock = threading.Lock()
        self._unanswered = 0
        self._stop, self._stop_at = False, float("-inf")

    def _send(self, request: dict) -> None:
        self._file.write(json.dumps(request).encode() + b"\n")
        self._file.flush()
        self._unanswered += 1

    def _read_answers(self) -> None:
        while self._unanswered:
            line = self._file.readline()
            if not line:
                raise ConnectionError("trainyard: the rank's supervisor went away")
            self._unanswered -= 1
            answer = json.loads(line)
            if "error" in answer:
                raise RuntimeError(f"trainyard: {answer['error']}")
            self._stop, self._stop_at = bool(answer["stop"]), time.monotonic()

    def report(self, metrics: dict[str, float], step: int | None) -> None:
        with self._lock:
            self._read_answers()  # the previous report's answer
            self._send({"op": "report", "metrics": metrics, "step": step})

    def should_stop(self) -> bool:
        with self._lock:
            if time.monotonic() - self._stop_at <= STOP_FRESH_S:
                # Fresh enough: a report's answer still on its way is read at the next call, so the usual
                # `report(); should_stop()` step costs no round trip (bench/report_cost.py).
                return self._stop
            if self._unanswered == 0:
                self._send({"op": "should_stop"})
            self._read_answers()
            return self._stop
