"""Steady API load during the measured window: reads and submits at fixed rates, each timed."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.api_load import _read_response, http_request


@dataclass
class Timings:
    reads: list[float] = field(default_factory=list)
    submits: list[float] = field(default_factory=list)
    errors: dict[int, int] = field(default_factory=dict)
    submitted: list[tuple[str, float]] = field(default_factory=list)  # (job id, wall time of the submit)
    gpu_jobs: set[str] = field(default_factory=set)  # the submitted jobs that asked for GPUs


class Connection:
    """One keep-alive HTTP/1.1 connection (the api_load bench's client: cheap on this host's CPU)."""

    def __init__(self, port: int):
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def send(self, request: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        self.writer.write(request)
        return await _read_response(self.reader)


async def steady_load(port: int, submitter: str, readers: list[tuple[str, str]], seconds: float,
                      reads_per_s: float, submits_per_s: float, probe_spec: Callable[[int], dict]) -> Timings:
    """Reads (a job by its owner's token, or a page of the probing tenant's list) and submits by the
    probing tenant, each request at its scheduled time on a free connection, latencies from send to
    full answer."""
    timings = Timings()
    pool: asyncio.Queue[Connection] = asyncio.Queue()
    for _ in range(8):
        pool.put_nowait(Connection(port))
    rng = random.Random(7)

    async def one(request: bytes, into: list[float], on_ok=None) -> None:
        conn = await pool.get()
        try:
            t0 = time.perf_counter()
            status, body = await conn.send(request)
            into.append(time.perf_counter() - t0)
            if status >= 400:
                timings.errors[status] = timings.errors.get(status, 0) + 1
            elif on_ok is not None:
                on_ok(body)
        finally:
            pool.put_nowait(conn)

    def read() -> bytes:
        if rng.random() < 0.8:
            job_id, token = rng.choice(readers)
            return http_request("GET", f"/v1/jobs/{job_id}", token)
        return http_request("GET", "/v1/jobs?limit=50", submitter)

    def submitted(gpus: bool) -> Callable[[bytes], None]:
        def note(body: bytes) -> None:
            job_id = json.loads(body)["id"]
            timings.submitted.append((job_id, time.time()))
            if gpus:
                timings.gpu_jobs.add(job_id)
        return note

    tasks = []
    start = time.monotonic()
    events = sorted([(i / reads_per_s, "read") for i in range(int(seconds * reads_per_s))]
                    + [(i / submits_per_s, "submit") for i in range(int(seconds * submits_per_s))])
    for n, (at, kind) in enumerate(events):
        await asyncio.sleep(max(0.0, start + at - time.monotonic()))
        if kind == "read":
            tasks.append(asyncio.create_task(one(read(), timings.reads)))
        else:
            job = probe_spec(n)
            body = json.dumps(job).encode()
            tasks.append(asyncio.create_task(one(http_request("POST", "/v1/jobs", submitter, body),
                                                 timings.submits, submitted(job["resources"]["gpus_per_worker"] > 0))))
    await asyncio.gather(*tasks)
    return timings
