"""The job reader (service/db/job_reader.py) hands pooled connections back as it found them."""

from __future__ import annotations

import pytest

from service.db.engine import make_engine, migrate
from service.db.job_reader import JobReader
from tests.db_fixtures import make_db_url


def test_a_failed_read_never_leaves_an_autocommit_connection_in_the_pool(tmp_path):
    url, schema = make_db_url("postgresql", tmp_path)
    engine = make_engine(url)
    try:
        migrate(engine)
        reader = JobReader(engine)
        assert reader.read("nope", "nobody") is None  # the pool now holds a connection the reader used
        reader.sql = "SELECT no_such_column FROM jobs"
        with pytest.raises(Exception, match="no_such_column"):
            reader.read("nope", "nobody")
        for _ in range(3):  # whichever pooled connection a transaction gets, it is a transactional one
            with engine.connect() as conn:
                assert conn.connection.driver_connection.autocommit is False
    finally:
        engine.dispose()
        if schema:
            from tests.live import drop_pg_schema
            drop_pg_schema(schema)


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_an_id_with_a_nul_character_is_no_job_not_a_database_error(tmp_path, backend):
    """Found by the soak: GET /v1/jobs/%00 was a 500 on PostgreSQL (it refuses NUL in text)."""
    url, schema = make_db_url(backend, tmp_path)
    engine = make_engine(url)
    try:
        migrate(engine)
        assert JobReader(engine).read("ab\x00cd", "nobody") is None
    finally:
        engine.dispose()
        if schema:
            from tests.live import drop_pg_schema
            drop_pg_schema(schema)


def test_the_repository_finds_no_job_for_a_nul_id_either(sessions):
    from service.db import repository as repo

    with sessions() as s:
        assert repo.get_job(s, "ab\x00cd") is None


def _terminate(url: str, pids: set[int]) -> None:
    """What a PostgreSQL restart does to a pool's connections, to these backends only (the server is shared)."""
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg", "postgresql").split("?")[0], autocommit=True) as admin:
        for pid in pids:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


def test_a_read_after_the_database_dropped_the_pooled_connections_reads_again(tmp_path):
    """Found by the soak: after a PostgreSQL restart, a replica's first GET /v1/jobs/{id} was a 500."""
    url, schema = make_db_url("postgresql", tmp_path)
    engine = make_engine(url)
    try:
        migrate(engine)
        reader = JobReader(engine)
        assert reader.read("nope", "nobody") is None
        held = [engine.raw_connection() for _ in range(3)]  # the pool now holds several live connections
        pids = {c.driver_connection.info.backend_pid for c in held}
        for c in held:
            c.close()
        _terminate(url, pids)
        for _ in range(4):
            assert reader.read("nope", "nobody") is None
    finally:
        engine.dispose()
        if schema:
            from tests.live import drop_pg_schema
            drop_pg_schema(schema)
