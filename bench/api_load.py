"""API load and start-latency benchmark against the live service (not a test; prints tables).

1. For SQLite and PostgreSQL: a `trainyard serve` process with its scheduler paused (jobs
   stay QUEUED) takes concurrent submissions (each with its own Idempotency-Key) and then
   concurrent reads; prints submits/s, reads/s, p50/p99 latency, and checks in the
   database that every accepted job is stored exactly once (also after replaying keys).
2. On a running service: time from POST /v1/jobs to the first training step of a 2-worker
   job, beside `ray job submit` of an equivalent Ray Train TorchTrainer script on the same
   Ray (bench/raytrain_first_step.py).

    .venv/bin/python bench/api_load.py [--submits 2000 --reads 10000 --concurrency 16]

The Ray Jobs comparison needs Ray's dashboard (`pip install -e '.[bench]'`, i.e. ray[default]).
The load generator is a small keep-alive HTTP/1.1 client on asyncio, so the client costs
little of this 2-core machine's CPU and the numbers measure the service.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.live import Server, create_pg_schema, drop_pg_schema, free_port, pg_schema_url  # noqa: E402

console = Console(width=160)  # tables stay readable when piped to a file
TINY = {"name": "bench", "model": {"name": "gpt", "n_layers": 1, "d_model": 32, "n_heads": 2, "seq_len": 32},
        "data": {"name": "text:pystdlib", "max_bytes": 200_000},
        "train": {"steps": 20, "global_batch_size": 16, "micro_batch_size": 4, "lr": 3e-3, "warmup_steps": 2},
        "resources": {"workers": 2}}
RAY_ENV = {"RAY_AUTH_MODE": "disabled"}


# --- a tiny keep-alive HTTP client -------------------------------------------


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    lower = head.lower()
    i = lower.index(b"content-length:") + 15
    length = int(lower[i:lower.index(b"\r\n", i)])
    return status, await reader.readexactly(length)


async def _load(port: int, requests: list[bytes], concurrency: int) -> tuple[list[float], list[tuple[int, bytes]], float]:
    latencies: list[float] = [0.0] * len(requests)
    responses: list[tuple[int, bytes]] = [(0, b"")] * len(requests)
    next_index = iter(range(len(requests)))

    async def worker():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for i in next_index:
            t0 = time.perf_counter()
            writer.write(requests[i])
            responses[i] = await _read_response(reader)
            latencies[i] = time.perf_counter() - t0
        writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, responses, time.perf_counter() - start


def http_request(method: str, path: str, token: str, body: bytes = b"", headers: dict | None = None) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Authorization: Bearer {token}",
             f"Content-Length: {len(body)}"]
    if body:
        lines.append("Content-Type: application/json")
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


# --- part 1: submits and reads ----------------------------------------------------


def load_backend(backend: str, ray_address: str, args) -> dict:
    home = Path(tempfile.mkdtemp(prefix=f"ty-bench-{backend}-"))
    schema = None
    if backend == "sqlite":
        url = f"sqlite:///{home}/trainyard.db"
    else:
        schema = create_pg_schema()
        url = pg_schema_url(schema)
    server = Server(home, url, ray_address, TRAINYARD_SCHEDULER_ENABLED="false",
                    TRAINYARD_MAX_ACTIVE_JOBS_PER_TENANT="1000000", TRAINYARD_WARM_WORKERS="0",
                    TRAINYARD_STANDBY_SUPERVISORS="0", **RAY_ENV).start()
    try:
        with server.client() as admin:
            token = admin.post("/v1/tenants", json={"name": f"bench-{uuid.uuid4().hex[:6]}"}).json()["token"]
        body = json.dumps(TINY).encode()
        keys = [uuid.uuid4().hex for _ in range(args.submits)]
        posts = [http_request("POST", "/v1/jobs", token, body, {"Idempotency-Key": k}) for k in keys]
        # warm-up (not timed): connection setup, caches
        asyncio.run(_load(server.port, [http_request("GET", "/v1/jobs?limit=1", token)] * 50, 4))
        sub_lat, sub_resp, sub_wall = asyncio.run(_load(server.port, posts, args.concurrency))
        accepted = [json.loads(b)["id"] for s, b in sub_resp if s == 201]
        replay = random.sample(range(args.submits), min(200, args.submits))
        _, rep_resp, _ = asyncio.run(_load(server.port, [posts[i] for i in replay], args.concurrency))
        replay_same = all(s == 201 and json.loads(b)["id"] == json.loads(sub_resp[i][1])["id"]
                          for i, (s, b) in zip(replay, rep_resp))
        gets = [http_request("GET", f"/v1/jobs/{random.choice(accepted)}", token) for _ in range(args.reads)]
        read_lat, read_resp, read_wall = asyncio.run(_load(server.port, gets, args.concurrency))
        stored, dup_keys = _stored(url, keys)
        return {
            "backend": backend, "submits": len(posts), "accepted": len(accepted),
            "submit_errors": sum(1 for s, _ in sub_resp if s != 201),
            "submits_per_s": len(posts) / sub_wall, "submit_p50": pct(sub_lat, 0.5), "submit_p99": pct(sub_lat, 0.99),
            "reads": len(gets), "read_errors": sum(1 for s, _ in read_resp if s != 200),
            "reads_per_s": len(gets) / read_wall, "read_p50": pct(read_lat, 0.5), "read_p99": pct(read_lat, 0.99),
            "exactly_once": stored == len(set(accepted)) == len(accepted) and dup_keys == 0 and replay_same,
            "stored": stored,
        }
    finally:
        server.stop()
        if schema:
            drop_pg_schema(schema)


def _stored(url: str, keys: list[str]) -> tuple[int, int]:
    """(jobs stored with these keys, keys stored more than once), read straight from the database."""
    from sqlalchemy import func, select

    from service.db.engine import make_engine, make_sessionmaker
    from service.db.models import Job

    engine = make_engine(url)
    with make_sessionmaker(engine)() as s:
        rows = s.execute(select(Job.idempotency_key, func.count()).where(Job.idempotency_key.in_(keys))
                         .group_by(Job.idempotency_key)).all()
    engine.dispose()
    return sum(n for _, n in rows), sum(1 for _, n in rows if n > 1)


# --- part 2: POST to first step, and the Ray Jobs baseline ---------------------------


def first_step_service(ray_address: str, runs: int) -> list[dict]:
    """Run 1 right after the service is ready (its warm pools still filling); later runs on the
    running service once its pools have refilled, which is the steady state."""
    home = Path(tempfile.mkdtemp(prefix="ty-bench-start-"))
    server = Server(home, f"sqlite:///{home}/trainyard.db", ray_address, TRAINYARD_LOOP_INTERVAL_S="0.1",
                    **RAY_ENV).start()
    out = []
    try:
        with server.client() as c:
            for run in range(runs):
                if run:
                    _wait_warm(ray_address)
                t0 = time.time()
                job = c.post("/v1/jobs", json=TINY).json()
                while True:
                    points = c.get(f"/v1/jobs/{job['id']}/metrics", params={"limit": 1}).json()["points"]
                    if points:
                        seen = time.time()
                        break
                    time.sleep(0.02)
                out.append({"first_step_s": points[0]["ts"] - t0, "seen_via_api_s": seen - t0})
                while c.get(f"/v1/jobs/{job['id']}").json()["state"] not in ("SUCCEEDED", "FAILED", "CANCELLED"):
                    time.sleep(0.1)
    finally:
        server.stop()
    return out


def _wait_warm(ray_address: str, workers: int = 2, timeout: float = 90) -> None:
    """Until the cluster's warm worker pool has `workers` idle ranks again."""
    import ray

    from workers.pool import find_pool

    if not ray.is_initialized():
        ray.init(address=ray_address, namespace="trainyard", log_to_driver=False)
    deadline = time.time() + timeout
    while time.time() < deadline:
        pool = find_pool()
        if pool is not None and ray.get(pool.stats.remote())["idle"] >= workers:
            return
        time.sleep(0.5)
    console.print("[yellow]warm pool did not refill in time; measuring anyway[/yellow]")


def first_step_ray_jobs(dashboard: str, runs: int) -> list[dict]:
    out = []
    env = {**os.environ, **RAY_ENV}
    runtime_env = json.dumps({"env_vars": {"PYTHONPATH": str(ROOT)}})
    for _ in range(runs):
        result = Path(tempfile.mkdtemp()) / "first-step.json"
        t0 = time.time()
        subprocess.run([str(ROOT / ".venv/bin/ray"), "job", "submit", "--address", dashboard, "--no-wait",
                        "--runtime-env-json", runtime_env, "--", sys.executable,
                        str(ROOT / "bench/raytrain_first_step.py"), "--out", str(result)],
                       env=env, check=True, capture_output=True)
        deadline = time.time() + 300
        while not result.exists() and time.time() < deadline:
            time.sleep(0.05)
        if not result.exists():
            raise RuntimeError("the Ray Jobs baseline did not reach its first step in 300 s")
        time.sleep(0.1)
        out.append({"first_step_s": json.loads(result.read_text())["first_step_ts"] - t0})
        _wait_ray_jobs_idle(dashboard)
    return out


def _wait_ray_jobs_idle(dashboard: str) -> None:
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(dashboard)
    while any(j.status in (JobStatus.PENDING, JobStatus.RUNNING) for j in client.list_jobs()):
        time.sleep(0.2)


class RayHead:
    """A Ray head with the dashboard (Ray Jobs), as its own cluster; stopped by SIGTERM to `ray start --block`."""

    def __init__(self):
        self.port, self.dash = free_port(), free_port()
        self.address, self.dashboard = f"127.0.0.1:{self.port}", f"http://127.0.0.1:{self.dash}"

    def __enter__(self) -> "RayHead":
        cmd = [str(ROOT / ".venv/bin/ray"), "start", "--head", "--block", "--num-cpus=8", f"--port={self.port}",
               "--include-dashboard=true", f"--dashboard-port={self.dash}", "--disable-usage-stats"]
        env = {**os.environ, **RAY_ENV, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if httpx.get(f"{self.dashboard}/api/version", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise RuntimeError("Ray head did not come up")

    def __exit__(self, *exc) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--submits", type=int, default=2000)
    parser.add_argument("--reads", type=int, default=10000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--start-runs", type=int, default=3)
    parser.add_argument("--skip-start", action="store_true", help="only the API load part")
    parser.add_argument("--skip-load", action="store_true", help="only the start-latency part")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # still stop the Ray head and services
    os.environ.update(RAY_ENV)
    with RayHead() as head:
        if not args.skip_load:
            load_tables(head, args)
        if not args.skip_start:
            start_tables(head, args)


def load_tables(head: RayHead, args) -> None:
    rows = [load_backend(b, head.address, args) for b in ("sqlite", "postgresql")]
    table = Table(title=f"API load: {args.submits} submits then {args.reads} reads, {args.concurrency} connections")
    for col in ("backend", "submits/s", "submit p50 ms", "submit p99 ms", "reads/s", "read p50 ms", "read p99 ms",
                "errors", "stored exactly once"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(r["backend"], f"{r['submits_per_s']:.0f}", f"{r['submit_p50']:.1f}", f"{r['submit_p99']:.1f}",
                      f"{r['reads_per_s']:.0f}", f"{r['read_p50']:.1f}", f"{r['read_p99']:.1f}",
                      str(r["submit_errors"] + r["read_errors"]),
                      f"{'yes' if r['exactly_once'] else 'NO'} ({r['stored']}/{r['accepted']})")
    console.print(table)
    console.print("targets: >= 200 submits/s, >= 1000 reads/s, p99 < 100 ms")


def start_tables(head: RayHead, args) -> None:
    ours = first_step_service(head.address, args.start_runs)
    theirs = first_step_ray_jobs(head.dashboard, args.start_runs)
    table = Table(title="Time from submission to the first training step (2 workers, tiny GPT, same Ray)")
    for col in ("path", *[f"run {i + 1} s" for i in range(args.start_runs)], "median s"):
        table.add_column(col, justify="right")
    table.add_row("POST /v1/jobs (trainyard; run 1 cold)", *[f"{r['first_step_s']:.2f}" for r in ours],
                  f"{statistics.median(r['first_step_s'] for r in ours):.2f}")
    table.add_row("  ... seen via GET metrics", *[f"{r['seen_via_api_s']:.2f}" for r in ours],
                  f"{statistics.median(r['seen_via_api_s'] for r in ours):.2f}")
    table.add_row("ray job submit (TorchTrainer)", *[f"{r['first_step_s']:.2f}" for r in theirs],
                  f"{statistics.median(r['first_step_s'] for r in theirs):.2f}")
    console.print(table)
    ratio = statistics.median(r["first_step_s"] for r in ours) / statistics.median(r["first_step_s"] for r in theirs)
    console.print(f"trainyard / Ray Jobs = {ratio:.2f} (targets: trainyard < 3 s, ratio < 0.1)")


if __name__ == "__main__":
    main()
