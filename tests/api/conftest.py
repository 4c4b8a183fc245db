"""Live servers for the API tests: real `trainyard serve` processes on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid

import pytest
from fastapi.testclient import TestClient

from api.http.app import create_app
from service.control import ControlPlane
from service.db.engine import migrate
from service.settings import Settings
from tests.db_fixtures import BACKENDS, db_url, live_db_url, make_db_url, row_counter, sessions  # noqa: F401
from tests.live import ADMIN_TOKEN, Server, drop_pg_schema

QUOTA = 5


@pytest.fixture
def client(tmp_path):
    """The app on a migrated SQLite database with the admin's token, no Ray and no loops: what a submit
    checks before anything runs (422s and what is stored)."""
    from api.http.deps import token_cache

    token_cache.clear()  # the process's cache: the same token named another database's tenant before
    settings = Settings(home=tmp_path, admin_token=ADMIN_TOKEN)
    app = create_app(settings)
    plane = ControlPlane(settings)
    migrate(plane.engine)
    plane.bootstrap_admin()
    app.state.plane = plane  # no Ray and no loops: submit's own checks
    yield TestClient(app, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    plane.writes.close()
    plane.engine.dispose()


@pytest.fixture(scope="module", params=BACKENDS)
def queue_server(request, tmp_path_factory, ray_address):
    """A service whose scheduler is paused: accepted jobs stay QUEUED. One per backend per module."""
    home = tmp_path_factory.mktemp(f"home-{request.param}")
    url, schema = make_db_url(request.param, home)
    server = Server(home, url, ray_address, TRAINYARD_SCHEDULER_ENABLED="false", TRAINYARD_STANDBY_SUPERVISORS="0",
                    TRAINYARD_MAX_ACTIVE_JOBS_PER_TENANT=str(QUOTA), TRAINYARD_MAX_BODY_BYTES="200000")
    server.database_url = url
    server.start()
    yield server
    server.stop()
    if schema:
        drop_pg_schema(schema)


@pytest.fixture
def tenant(queue_server):
    """A fresh tenant (so quotas and listings start empty) and its client."""
    with queue_server.client() as admin:
        resp = admin.post("/v1/tenants", json={"name": f"t-{uuid.uuid4().hex[:8]}"})
        assert resp.status_code == 201, resp.text
        token = resp.json()["token"]
    with queue_server.client(token) as client:
        yield client


@pytest.fixture
def counts(queue_server):
    """Row counts of every table, read straight from the service's database."""
    read, dispose = row_counter(queue_server.database_url)
    yield read
    dispose()
