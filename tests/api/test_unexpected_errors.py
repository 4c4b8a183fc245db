"""A fault in a handler is a JSON 500 in the error schema, logged once, counted, audited, and the
keep-alive connection it came on serves the next request (api/http/server_errors.py)."""

from __future__ import annotations

import logging
import threading
import time

import httpx
import pytest
import uvicorn
from fastapi import Request
from sqlalchemy.exc import OperationalError

from api.cli.processes import listen
from api.http.app import create_app
from api.http.database_outage import DATABASE_UNAVAILABLE
from api.http.deps import PrincipalDep, require_by_method
from api.http.errors import INTERNAL_ERROR
from api.http.slow_clients import bounded_http
from service.control import ControlPlane
from service.db.engine import migrate
from service.settings import Settings
from tests.helpers import tiny_spec
from tests.live import ADMIN_TOKEN


@pytest.fixture
def served_app(tmp_path):
    """create_app's app on a free port, served in this process by uvicorn with the production protocol, so
    that a test can override its dependencies. Its control plane has a migrated SQLite database and the
    admin token, but no Ray and no loops (not started)."""
    settings = Settings(home=tmp_path, admin_token=ADMIN_TOKEN)
    app = create_app(settings)
    plane = ControlPlane(settings)
    migrate(plane.engine)
    plane.bootstrap_admin()
    app.state.plane = plane
    sock = listen("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_level="warning", http=bounded_http(10)))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "uvicorn did not start"
    yield app, f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(10)
    plane.writes.close()
    plane.engine.dispose()


def _connection(resp: httpx.Response) -> tuple:
    return resp.extensions["network_stream"].get_extra_info("client_addr")  # the client's end of the socket


def test_a_handler_fault_is_a_json_500_and_the_connection_serves_the_next_request(served_app, caplog):
    app, url = served_app

    async def broken(principal: PrincipalDep):  # after authentication: the call is audited
        raise RuntimeError("a bug, with internals: /secret/path")

    app.dependency_overrides[require_by_method] = broken  # every /v1/jobs route, as a bug would
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30) as client:
        with caplog.at_level(logging.ERROR):
            failed = client.post("/v1/jobs", json=tiny_spec())
            assert failed.status_code == 500, failed.text
            assert failed.json() == {"detail": INTERNAL_ERROR, "errors": []}  # the error schema, no internals
            audit = client.get("/v1/audit", params={"action": "job.submit"})
        assert audit.status_code == 200, audit.text
        assert _connection(audit) == _connection(failed)  # the same keep-alive connection
        assert [(r["status"], r["detail"]) for r in audit.json()["records"]] == [(500, INTERNAL_ERROR)]
        metrics = client.get("/metrics")
        assert _connection(metrics) == _connection(failed)
        assert ('trainyard_http_request_duration_seconds_count{method="POST",route="/v1/jobs",status="500"} 1.0'
                in metrics.text)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert [(r.name, r.getMessage()) for r in errors] == [("trainyard.api", "unhandled error on POST /v1/jobs")]
    assert errors[0].exc_info and isinstance(errors[0].exc_info[1], RuntimeError)  # with its traceback


def test_a_read_that_met_a_dropped_database_connection_is_read_again_not_a_500(served_app):
    """Found by the soak: after a PostgreSQL restart each replica answered its first reads 500
    (the pool has no pre-ping). A read is run once more; a write is not, and is a 503
    (api/http/database_outage.py; tests/api/test_database_outage.py on a real PostgreSQL)."""
    app, url = served_app
    calls: list[str] = []

    async def dropped_once(request: Request, principal: PrincipalDep):
        calls.append(request.method)
        if len(calls) == 1:
            raise OperationalError("SELECT 1", {}, Exception("terminating connection due to administrator command"),
                                   connection_invalidated=True)
        return principal

    app.dependency_overrides[require_by_method] = dropped_once
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=30) as client:
        resp = client.get("/v1/jobs")
        assert resp.status_code == 200, resp.text
        assert calls == ["GET", "GET"]
        calls.clear()
        write = client.post("/v1/jobs", json=tiny_spec())  # a write is not repeated: a 503, not a 500
        assert write.status_code == 503, write.text
        assert write.json() == {"detail": DATABASE_UNAVAILABLE, "errors": []} and write.headers["Retry-After"]
        assert calls == ["POST"]
