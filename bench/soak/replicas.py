"""Two `trainyard serve` replicas (tests.live.Server) on one database and one Ray; which one leads
is read from the lease row, and the soak's REST client fails over between them as a load balancer would."""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
from sqlalchemy import create_engine, text

from tests.live import ADMIN_TOKEN, Server

LEASE_TTL_S = 5


class Replicas:
    def __init__(self, work: Path, database_url: str, ray_address: str, count: int = 2):
        shared = {"TRAINYARD_LEASE_TTL_S": str(LEASE_TTL_S), "TRAINYARD_STORAGE_URI": str(work / "storage"),
                  "TRAINYARD_RATE_LIMIT_PER_S": "0", "TRAINYARD_WARM_WORKERS": "2"}
        self.storage = work / "storage"
        self.servers = [Server(work / f"replica-{i}", database_url, ray_address, **shared) for i in range(count)]
        self._lease_db = create_engine(database_url, pool_pre_ping=True)

    def start(self) -> None:
        for server in self.servers:
            server.start(timeout=180)

    def live(self) -> list[Server]:
        return [s for s in self.servers if s.proc and s.proc.poll() is None]

    def leader(self) -> Server | None:
        """The replica whose pid the lease names (None while no live replica holds it)."""
        try:
            with self._lease_db.connect() as conn:
                holder = conn.execute(text("SELECT holder FROM leases")).scalar()
        except Exception:  # the database restarting: nobody is known to lead
            return None
        pid = int(holder.split(":")[1]) if holder else None
        return next((s for s in self.servers if s.proc and s.proc.poll() is None and s.proc.pid == pid), None)

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        self._lease_db.dispose()


class Api:
    """REST over the replicas, round robin; a refused connection (a killed replica) moves to the next,
    as a load balancer's health check would. Counts every 5xx by route, with the request."""

    def __init__(self, replicas: Replicas, token: str = ADMIN_TOKEN):
        self.replicas, self.token = replicas, token
        self._next = itertools.count()
        self.server_errors: Counter[str] = Counter()
        self.examples: list[str] = []
        self._lock = threading.Lock()

    def request(self, method: str, path: str, token: str | None = None, **kw) -> httpx.Response:
        servers = self.replicas.servers
        start = next(self._next)
        last: Exception | None = None
        headers = {"Authorization": f"Bearer {token or self.token}", **kw.pop("headers", {})}
        for attempt in range(3 * len(servers)):
            server = servers[(start + attempt) % len(servers)]
            try:
                resp = httpx.request(method, server.url + path, timeout=30, headers=headers, **kw)
            except httpx.TransportError as exc:
                last = exc
                continue
            self.note(method, path, resp)
            return resp
        raise RuntimeError(f"no replica answered {method} {path}: {last}")

    def get_json(self, path: str, token: str | None = None, **kw) -> dict:
        """A GET's JSON; an error answer (a 5xx, counted) or no replica is tried again for a while."""
        for _ in range(30):
            try:
                resp = self.request("GET", path, token=token, **kw)
                if resp.status_code == 200:
                    return resp.json()
            except RuntimeError:
                pass
            time.sleep(1.0)
        raise RuntimeError(f"GET {path}: no 200 answer in 30 tries")

    def note(self, method: str, path: str, resp: httpx.Response) -> None:
        if resp.status_code >= 500:
            with self._lock:
                self.server_errors[f"{method} {path.split('?')[0]}"] += 1
                if len(self.examples) < 20:
                    self.examples.append(f"{method} {path[:120]} -> {resp.status_code} {resp.text[:200]}")
