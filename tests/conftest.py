"""Shared fixtures: a real local Ray for the tests that train."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """One real local Ray (8 logical CPUs on this 2-core machine) for the whole session."""
    import ray

    from service.ray_client import connect
    from service.settings import Settings

    connect(Settings(home=tmp_path_factory.mktemp("ray-home")))
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def ray_address(ray_cluster):
    """The session's local Ray, for the processes under test that join it (`trainyard serve`, `trainyard run`)."""
    return ray_cluster.get_runtime_context().gcs_address


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """One real MLflow tracking server on loopback (SQLite store) for the whole session."""
    from tests.mlflow_server import MlflowServer

    server = MlflowServer(tmp_path_factory.mktemp("mlflow")).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gcs_server(tmp_path_factory):
    """One real GCS JSON API (gcp-storage-emulator over HTTP) for the whole session. A test that uses it
    asks for `gcs_store`, which sets STORAGE_EMULATOR_HOST for its own duration: left in the session's
    environment it broke the share-nothing bed's Ray client server, started later from this process."""
    from tests.gcs_server import GcsServer

    server = GcsServer(tmp_path_factory.mktemp("gcs")).start()
    yield server
    server.stop()


@pytest.fixture
def gcs_store(gcs_server, monkeypatch):
    """The session's GCS server, reachable from this process (and the ranks it starts) for one test."""
    for key, value in gcs_server.env.items():
        monkeypatch.setenv(key, value)
    return gcs_server


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """One real S3 API (moto's server over HTTP) for the whole session; this process reaches it through
    the standard AWS_* variables (`s3_server.env` for the services and ranks a test starts)."""
    from tests.s3_server import S3Server

    server = S3Server(tmp_path_factory.mktemp("s3")).start()
    saved = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)
    yield server
    for k, v in saved.items():
        os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    server.stop()


@pytest.fixture(autouse=True)
def shared_ray_left_clean(request):
    """Services started by a test leave the cluster's shared pieces (the warm worker pool,
    standby supervisors) behind in the session's Ray; remove them so that every test starts
    from an empty cluster and its own leak checks see only its own actors."""
    yield
    if "ray_cluster" not in request.fixturenames and "ray_address" not in request.fixturenames:
        return
    import ray

    from tests.helpers import alive_actors, wait_until

    for entry in ray.util.list_named_actors(all_namespaces=True):
        if entry["name"].startswith("trainyard-"):
            try:
                ray.kill(ray.get_actor(entry["name"], namespace=entry["namespace"]))
            except ValueError:
                pass  # already gone
    wait_until(lambda: not any((a.get("Name") or "").startswith("trainyard-") for a in alive_actors()), 30)


def pytest_runtest_logstart(nodeid, location):
    """Where a pytest that died (no summary: killed, or exited by Ray's core worker) was: `make test`
    names this test and the tail of that process's Ray driver log (tests/died_during.py)."""
    progress = os.environ.get("TRAINYARD_TEST_PROGRESS")
    if progress:
        with open(progress, "w") as f:
            f.write(f"{os.getpid()} {nodeid}\n")
