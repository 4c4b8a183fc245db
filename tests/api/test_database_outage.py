"""A real PostgreSQL stopped under a live `trainyard serve` (api/http/database_outage.py): a read waits
out a short outage and answers 200 on its keep-alive connection; a longer outage is a 503 with
Retry-After in the error schema, for reads and writes, never a 500; and a write refused so wrote nothing.

The database is a private PostgreSQL (bench/soak/postgres.py: its own data directory and port), so
stopping it never touches the machine's shared server. One service for both tests (a start is the
slow part): its TRAINYARD_DB_UNAVAILABLE_WAIT_S is shorter than the default 10 s, to keep the long
outage short, and longer than the short outage with the time `pg_ctl start` takes on a busy machine.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest

from api.http.database_outage import DATABASE_UNAVAILABLE
from bench.soak.postgres import PrivatePostgres
from tests.db_fixtures import row_counter
from tests.helpers import tiny_spec
from tests.live import Server

WAIT_S = 6
OUTAGE_S = 2  # the short outage: the database is started again after this (pg_ctl start adds a second or so)


@pytest.fixture(scope="module")
def outage(tmp_path_factory, ray_address):
    pg_root = Path(tempfile.mkdtemp(prefix="trainyard-db-outage-"))  # as bench/soak/run.py: pytest's are 0700,
    os.chmod(pg_root, 0o755)  # and the private PostgreSQL runs as its own user below it when we are root
    pg = PrivatePostgres(pg_root / "pg")
    server = Server(tmp_path_factory.mktemp("db-outage"), pg.url, ray_address, TRAINYARD_SCHEDULER_ENABLED="false",
                    TRAINYARD_STANDBY_SUPERVISORS="0", TRAINYARD_WARM_WORKERS="0",
                    TRAINYARD_DB_UNAVAILABLE_WAIT_S=str(WAIT_S))
    try:
        pg.start()
        server.start()
        yield pg, server
    finally:
        server.stop()
        pg.stop()
        shutil.rmtree(pg_root, ignore_errors=True)


def _connection(resp: httpx.Response) -> tuple:
    return resp.extensions["network_stream"].get_extra_info("client_addr")  # the client's end of the socket


def _submit(client: httpx.Client, key: str) -> httpx.Response:
    return client.post("/v1/jobs", json={**tiny_spec(), "name": key}, headers={"Idempotency-Key": key})


def _row_counts(pg: PrivatePostgres) -> dict[str, int]:
    """Read straight from the database, on a connection of its own (a pooled one would not outlive a stop)."""
    read, dispose = row_counter(pg.url)
    try:
        return read()
    finally:
        dispose()


def _metric(text: str, method: str, route: str, status: int) -> float:
    prefix = f'trainyard_http_request_duration_seconds_count{{method="{method}",route="{route}",status="{status}"}} '
    return next((float(line[len(prefix):]) for line in text.splitlines() if line.startswith(prefix)), 0.0)


def test_a_read_during_a_short_database_outage_waits_and_answers_200(outage):
    pg, server = outage
    with server.client() as client:
        created = _submit(client, "before-the-outage")
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
    clients = [server.client(), server.client()]
    for c in clients:  # a keep-alive connection each, opened before the outage
        assert c.get("/healthz").status_code == 200
    answers: dict[str, tuple[httpx.Response | BaseException, float]] = {}

    def read(client: httpx.Client, path: str) -> None:
        t0 = time.monotonic()
        try:
            answers[path] = client.get(path), time.monotonic() - t0
        except BaseException as exc:  # noqa: BLE001 - the assertion below names it
            answers[path] = exc, time.monotonic() - t0

    def submit() -> None:  # a keyed write waits the outage out too: its key makes a second run safe
        with server.client() as c:
            t0 = time.monotonic()
            answers["submit"] = _submit(c, "during-a-short-outage"), time.monotonic() - t0

    pg.stop()
    try:
        threads = [threading.Thread(target=read, args=(c, path))
                   for c, path in zip(clients, ["/v1/jobs", f"/v1/jobs/{job_id}"])]
        threads.append(threading.Thread(target=submit))
        for t in threads:
            t.start()
        time.sleep(OUTAGE_S)
    finally:
        pg.start()
    for t in threads:
        t.join(30)
    try:
        submitted, took = answers["submit"]
        assert submitted.status_code == 201, submitted.text  # type: ignore[union-attr]
        assert took >= OUTAGE_S - 0.5, f"the submit answered in {took:.1f} s: the database was not down"
        for c, path in zip(clients, ["/v1/jobs", f"/v1/jobs/{job_id}"]):
            resp, took = answers[path]
            assert isinstance(resp, httpx.Response) and resp.status_code == 200, \
                f"{path}: {resp!r} {getattr(resp, 'text', '')}\n{server.log.read_text()[-3000:]}"
            assert took >= OUTAGE_S - 0.5, f"{path} answered in {took:.1f} s: the database was not down"
            nxt = c.get(path)  # the same keep-alive connection serves the next request
            assert nxt.status_code == 200, nxt.text
            assert _connection(nxt) == _connection(resp)
        assert job_id in [j["id"] for j in answers["/v1/jobs"][0].json()["jobs"]]
        assert answers[f"/v1/jobs/{job_id}"][0].json()["id"] == job_id
    finally:
        for c in clients:
            c.close()


def test_a_long_database_outage_is_a_503_with_retry_after_for_reads_and_writes(outage):
    pg, server = outage
    with server.client() as client:
        before = _row_counts(pg)
        metrics_before = client.get("/metrics").text
        assert client.get("/v1/jobs").status_code == 200  # the token is cached: the submit gets to its write
        pg.stop()
        try:
            t0 = time.monotonic()
            unkeyed = client.post("/v1/jobs", json={**tiny_spec(), "name": "no-key"})  # not run twice: 503 now
            unkeyed_took, t0 = time.monotonic() - t0, time.monotonic()
            write = _submit(client, "during-the-outage")
            write_took, t0 = time.monotonic() - t0, time.monotonic()
            read = client.get("/v1/jobs")
            read_took = time.monotonic() - t0
        finally:
            pg.start()
        for resp in (read, write, unkeyed):
            assert resp.status_code == 503, f"{resp.status_code} {resp.text}\n{server.log.read_text()[-3000:]}"
            assert resp.headers["Retry-After"] == str(WAIT_S)
            assert resp.json() == {"detail": DATABASE_UNAVAILABLE, "errors": []}  # the error schema
        assert unkeyed_took < WAIT_S / 2, f"the unkeyed submit answered after {unkeyed_took:.1f} s"
        for name, took in (("read", read_took), ("keyed submit", write_took)):
            assert WAIT_S - 0.5 <= took < WAIT_S + 5, f"the {name} answered after {took:.1f} s"

        # The database is back: reads and writes answer again, on the same connection.
        listed = client.get("/v1/jobs")
        assert listed.status_code == 200, listed.text
        assert _connection(listed) == _connection(write) == _connection(read) == _connection(unkeyed)
        retried = _submit(client, "during-the-outage")  # the refused submit's key: it stored nothing
        assert retried.status_code == 201, retried.text
        assert retried.headers["Idempotent-Replayed"] == "false"
        after = _row_counts(pg)
        assert after["jobs"] == before["jobs"] + 1, (before, after)  # the refused submit left no row
        metrics = client.get("/metrics").text
    # Counted as what they answered, once each: no 500, and the read's retries are not requests.
    for method, status, n in (("GET", 503, 1), ("POST", 503, 2), ("GET", 500, 0), ("POST", 500, 0),
                              ("POST", 201, 1)):
        counted = _metric(metrics, method, "/v1/jobs", status) - _metric(metrics_before, method, "/v1/jobs", status)
        assert counted == n, (method, status, counted)
