"""What the processes of one `trainyard serve --workers N` share (made by the primary, inherited by
the API workers it spawns): Ray readiness and the cluster's capacity (only the primary talks to
Ray), the scheduler's wake-up, and a queue that carries the workers' HTTP timings to the primary,
whose /metrics is the one every process answers with.
"""

from __future__ import annotations

import ctypes
import json
import queue
from multiprocessing.context import SpawnContext


class SharedState:
    def __init__(self, ctx: SpawnContext, primary_url: str, api_workers: int):
        self.api_workers = api_workers  # spawned beside the primary
        self.api_workers_up = ctx.Value(ctypes.c_int, 0)  # counted by each worker once it serves
        self.ray_ready = ctx.Event()
        self.wake = ctx.Event()
        self.http = ctx.Queue(maxsize=50_000)
        self.primary_url = primary_url  # the primary's private loopback listener
        self._capacity = ctx.Array(ctypes.c_char, 1 << 16)
        self._ray_error = ctx.Array(ctypes.c_char, 2048)
        self._supervisor_placement = ctx.Array(ctypes.c_char, 2048)  # why no supervisor can be placed

    @property
    def capacity(self) -> tuple[dict, dict] | None:
        raw = self._capacity.value
        return tuple(json.loads(raw)) if raw else None

    @capacity.setter
    def capacity(self, value: tuple[dict, dict] | None) -> None:
        raw = json.dumps(value).encode() if value is not None else b""
        self._capacity.value = raw if len(raw) < len(self._capacity) else b""  # too large: unknown

    @property
    def ray_error(self) -> str | None:
        return self._ray_error.value.decode(errors="replace") or None

    @ray_error.setter
    def ray_error(self, value: str | None) -> None:
        self._ray_error.value = (value or "").encode()[: len(self._ray_error) - 1]

    @property
    def supervisor_placement(self) -> str | None:
        return self._supervisor_placement.value.decode(errors="replace") or None

    @supervisor_placement.setter
    def supervisor_placement(self, value: str | None) -> None:
        self._supervisor_placement.value = (value or "").encode()[: len(self._supervisor_placement) - 1]

    def observe_http(self, method: str, route: str, status: int, seconds: float) -> None:
        try:
            self.http.put_nowait((method, route, status, seconds))
        except queue.Full:  # the primary is behind: a lost timing, never a slower request
            pass

    def worker_up(self, delta: int) -> None:
        with self.api_workers_up.get_lock():
            self.api_workers_up.value += delta

    def workers_check(self) -> str:
        up = self.api_workers_up.value
        return "ok" if up >= self.api_workers else f"{up} of {self.api_workers} API worker processes serving"
