"""`trainyard serve --workers 2` (or TRAINYARD_API_WORKERS=2): a real primary and a real API worker
process on one socket, on SQLite and on PostgreSQL. Both answer; concurrent submits through
both are stored exactly once; /metrics counts every process's requests on any connection; a
killed worker is replaced; stopping the server leaves no process behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from sqlalchemy import func, select

from api.http.routers.system import PRIMARY_METRICS_TIMEOUT_S
from service.db.engine import make_engine, make_sessionmaker
from service.db.models import Job
from tests.helpers import tiny_spec, wait_until
from tests.live import Server

QUIET = {"TRAINYARD_SCHEDULER_ENABLED": "false", "TRAINYARD_WARM_WORKERS": "0", "TRAINYARD_STANDBY_SUPERVISORS": "0"}


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _api_workers(parent: int) -> list[int]:
    """The primary's spawned API worker processes (not multiprocessing's resource tracker)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if ppid == parent and b"spawn_main" in cmdline and b"resource_tracker" not in cmdline:
            found.append(int(entry.name))
    return found


def _posted(metrics: str) -> int:
    return int(sum(float(v) for v in re.findall(
        r'^trainyard_http_request_duration_seconds_count\{[^}]*method="POST"[^}]*route="/v1/jobs"[^}]*\} (\S+)$',
        metrics, re.M)))


def test_two_processes_share_the_load_and_the_metrics(live_db_url, ray_address, tmp_path):
    server = Server(tmp_path / "home", live_db_url, ray_address, "--workers", "2", **QUIET).start(timeout=180)
    replacement: list[int] = []
    try:
        # ready only once every API process serves
        assert server.client().get("/readyz").json()["checks"]["api_workers"] == "ok"
        [worker] = _api_workers(server.proc.pid)
        with server.client() as admin:
            token = admin.post("/v1/tenants", json={"name": "acme"}).json()["token"]
        spec = tiny_spec()
        keys = [uuid.uuid4().hex for _ in range(120)]
        clients = [httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=60)
                   for _ in range(12)]  # 12 keep-alive connections, spread by the kernel over both processes
        cpu_before = _cpu_s(worker)

        def submit(i: int) -> tuple[int, str]:
            r = clients[i % len(clients)].post("/v1/jobs", json=spec, headers={"Idempotency-Key": keys[i % 120]})
            return r.status_code, r.json().get("id", r.text)

        with ThreadPoolExecutor(12) as pool:
            first = list(pool.map(submit, range(120)))
            replays = list(pool.map(submit, range(120)))
            reads = list(pool.map(lambda i: clients[i % 12].get(f"/v1/jobs/{first[i % 120][1]}").status_code,
                                  range(600)))
        for c in clients:
            c.close()
        assert all(status == 201 for status, _ in first + replays), first + replays
        assert [job_id for _, job_id in replays] == [job_id for _, job_id in first]  # idempotent on either process
        assert reads == [200] * 600
        assert _cpu_s(worker) - cpu_before > 0.2, "the API worker process answered (almost) nothing"

        engine = make_engine(live_db_url)
        with make_sessionmaker(engine)() as s:
            rows = s.execute(select(Job.idempotency_key, func.count()).where(Job.idempotency_key.in_(keys))
                             .group_by(Job.idempotency_key)).all()
        engine.dispose()
        assert len(rows) == 120 and all(n == 1 for _, n in rows)

        # Whichever process a scrape reaches, it reports every process's requests (the primary's
        # registry, fed by the workers' timings).
        def every_scrape_counts_all() -> bool:
            scrapes = []
            for _ in range(6):
                with httpx.Client(base_url=server.url, timeout=30) as fresh:  # a new connection each time
                    scrapes.append(_posted(fresh.get("/metrics").text))
            return all(n == 240 for n in scrapes)

        assert wait_until(every_scrape_counts_all, 30)

        # A hung primary: a scrape that reaches the worker gets a prompt 503 that says why, within
        # Prometheus' scrape timeout, instead of waiting on the primary.
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            answers = []
            for _ in range(16):  # fresh connections until the kernel gives one to the worker (~1 in 2)
                try:
                    with httpx.Client(base_url=server.url, timeout=PRIMARY_METRICS_TIMEOUT_S + 3) as fresh:
                        answers.append(fresh.get("/metrics"))
                except httpx.TimeoutException:  # this connection went to the stopped primary
                    continue
                break
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        assert answers and answers[-1].status_code == 503, answers
        assert "the primary process did not answer" in answers[-1].text

        os.kill(worker, signal.SIGKILL)  # a crashed worker is replaced
        assert wait_until(lambda: _api_workers(server.proc.pid) not in ([], [worker]), 60)
        replacement = _api_workers(server.proc.pid)
        # A second server on the same port is refused, not silently given half the connections.
        second = subprocess.run([sys.executable, "-m", "api.cli", "serve", *server.serve_args], env=server.env, capture_output=True,
                                text=True, timeout=120, cwd=Path(__file__).parents[2])
        assert second.returncode != 0 and "address already in use" in second.stderr.lower(), second.stderr[-2000:]
        with server.client(token) as c:
            assert wait_until(lambda: c.get("/readyz").json()["checks"]["api_workers"] == "ok", 60)
            assert all(c.get(f"/v1/jobs/{first[0][1]}").status_code == 200 for _ in range(20))
    finally:
        server.stop()
    assert replacement and wait_until(lambda: not any(Path(f"/proc/{pid}").exists() for pid in replacement), 30), \
        "an API worker outlived the server"
