"""A command rank's line to its actor: newline-delimited JSON over a Unix socket.

Reports travel in batches: `report` adds its record to a list and returns; the list is sent as
one line when the previous send is SEND_EVERY_S old, by the report itself or, for a rank that
reports less often, by a small thread that sends it when due. One line per SEND_EVERY_S, not per
step, is what the actor's process wakes for, on the same CPUs as the ranks (bench/programs.py).
At most one line is in flight: each send first reads the previous line's answer, which also says
whether the rank should stop, and has long arrived unless the actor holds it (an injected `slow` or
`hang` fault), so such a hold stops the rank at its next send. `should_stop` answers from the last
answer read while that is under STOP_FRESH_S old, else sends what waits and reads the answer.

Each record carries the rank's own timing, measured here: `wall_s` from the previous report call
to this one, and `own_s` from the previous report's return to this one, leaving out any wait for
a held answer, so the supervisor's straggler scores see the rank's work and not the batching.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import threading
import time

SEND_EVERY_S = 0.1  # reports closer together than this travel in one line
STOP_FRESH_S = 1.0  # a stop flag answered this recently is current enough for should_stop()


class SocketSession:
    def __init__(self, path: str, send_every_s: float = SEND_EVERY_S):
        # 0 under injected faults: they act at the report of the step they name (workers/program/environment.py)
        self.send_every_s = send_every_s
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.connect(path)
        self._file = self._sock.makefile("rwb")
        self._lock = threading.Lock()
        self._unanswered = 0
        self._stop, self._stop_at = False, float("-inf")
        self._pending: list[dict] = []
        self._sent_at = float("-inf")
        self._called = self._returned = time.monotonic()
        self._error: Exception | None = None  # the sending thread's, raised at the rank's next call
        self._pid = os.getpid()  # a forked child (a data loader's worker) shares the socket, not the session
        self._due = threading.Event()  # records wait: the sending thread sends them once due
        threading.Thread(target=self._send_when_due, name="trainyard-reports", daemon=True).start()
        atexit.register(self._send_at_exit)  # the last steps' records, sent before the process ends

    def report(self, metrics: dict[str, float], step: int | None) -> None:
        called = time.monotonic()
        with self._lock:
            # Own time starts at the previous return and ends here: a wait above for a held answer is left out.
            record = {"metrics": metrics, "step": step, "wall_s": called - self._called,
                      "own_s": time.monotonic() - self._returned}
            self._called = called
            self._raise_sender_error()
            self._pending.append(record)
            if time.monotonic() - self._sent_at >= self.send_every_s:
                self._send_pending()
            else:
                self._due.set()
            self._returned = time.monotonic()

    def should_stop(self) -> bool:
        with self._lock:
            self._raise_sender_error()
            if time.monotonic() - self._stop_at <= STOP_FRESH_S:
                # Fresh enough: the usual `report(); should_stop()` step costs no round trip
                # (bench/report_cost.py); an answer on its way is read at the next send.
                return self._stop
            if self._pending:
                self._send_pending()
            elif self._unanswered == 0:
                self._send({"op": "should_stop"})
            self._read_answers()
            return self._stop

    def _send_pending(self) -> None:
        self._read_answers()  # the previous line's: at most one in flight
        self._send({"op": "report", "reports": self._pending})
        self._pending = []

    def _send(self, request: dict) -> None:
        self._file.write(json.dumps(request).encode() + b"\n")
        self._file.flush()
        self._unanswered += 1
        self._sent_at = time.monotonic()

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

    def _send_when_due(self) -> None:
        while self._due.wait():
            time.sleep(max(0.0, self._sent_at + self.send_every_s - time.monotonic()))
            with self._lock:
                self._due.clear()
                if self._pending and self._error is None:
                    try:
                        self._send_pending()
                    except (OSError, ValueError, RuntimeError) as exc:  # ConnectionError is an OSError
                        self._error = exc

    def _raise_sender_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _send_at_exit(self) -> None:
        if os.getpid() != self._pid:
            return  # a forked child's copy of the records: its parent sends them
        with self._lock:
            if self._pending and self._error is None:
                try:
                    self._send_pending()
                except (OSError, ValueError, RuntimeError):
                    pass  # the actor is gone: the group's end says why
