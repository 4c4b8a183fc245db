"""Database fixtures: every repository and API test runs on SQLite and on PostgreSQL."""

from __future__ import annotations

import pytest

from tests.live import create_pg_schema, drop_pg_schema, pg_schema_url

BACKENDS = ["sqlite", "postgresql"]
# The live end-to-end tests that train: PostgreSQL (production's database) in `make test`, both in
# `make test-all`; the repository, admission and API tests run on both everywhere.
LIVE_BACKENDS = [pytest.param("sqlite", marks=pytest.mark.exhaustive), "postgresql"]


def make_db_url(backend: str, tmp_path) -> tuple[str, str | None]:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path}/trainyard.db", None
    schema = create_pg_schema()  # raises (test fails) if PostgreSQL is unreachable
    return pg_schema_url(schema), schema


def _database(backend: str, tmp_path):
    url, schema = make_db_url(backend, tmp_path)
    yield url
    if schema:
        drop_pg_schema(schema)


@pytest.fixture(params=BACKENDS)
def db_url(request, tmp_path):
    yield from _database(request.param, tmp_path)


@pytest.fixture(params=LIVE_BACKENDS)
def live_db_url(request, tmp_path):
    yield from _database(request.param, tmp_path)


def row_counter(database_url: str):
    """Row counts of every table, read straight from a service's database: (read, dispose)."""
    from service.db.engine import make_engine, make_sessionmaker
    from service.db.row_counts import row_counts

    engine = make_engine(database_url)
    maker = make_sessionmaker(engine)

    def read() -> dict[str, int]:
        with maker() as s:
            return row_counts(s)

    return read, engine.dispose


@pytest.fixture
def sessions(db_url):
    from service.db.engine import make_engine, make_sessionmaker, migrate

    engine = make_engine(db_url)
    migrate(engine)
    yield make_sessionmaker(engine)
    engine.dispose()
