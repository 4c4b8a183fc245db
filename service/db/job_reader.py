"""One tenant's job by id, read with the statement compiled once and the driver's cursor.

This is the API's hottest read (every `--follow`, every dashboard poll). Through a SQLAlchemy
Connection, building the statement, its cache key, the execution context and the result object
cost several times the query itself: one read took 680 us on SQLite and 1250 us on PostgreSQL
that way on this 2-core machine, and 170 us and 455 us here. The statement is compiled once for
the engine's dialect, and each column is converted by the dialect's own result processor (JSON,
timestamps, booleans), so the row holds what a Core read's would.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import closing
from typing import Any

from sqlalchemy import Engine, bindparam, select
from sqlalchemy.exc import DBAPIError

from service.db.connection_errors import unreachable
from service.db.models import Job


class _Disconnected(Exception):
    """The database closed the connection under a read (`driver_error`: the driver's error)."""

    def __init__(self, driver_error: Exception):
        super().__init__(str(driver_error))
        self.driver_error = driver_error


class JobRow(dict):
    """A job's columns, also as attributes (what api.http.schemas.job_out reads)."""

    __getattr__ = dict.__getitem__


class JobReader:
    def __init__(self, engine: Engine):
        dialect = engine.dialect
        table = Job.__table__
        compiled = select(table).where(table.c.id == bindparam("id"), table.c.tenant_id == bindparam("tenant")) \
            .compile(dialect=dialect)
        self.sql = str(compiled)
        positional = compiled.positiontup  # qmark-style drivers (sqlite3) take a tuple in this order
        self._params: Callable[[str, str], Any] = (
            (lambda job_id, tenant: tuple({"id": job_id, "tenant": tenant}[k] for k in positional))
            if positional else (lambda job_id, tenant: {"id": job_id, "tenant": tenant}))
        self._types = [(c.key, c.type.dialect_impl(dialect)) for c in table.columns]
        self._columns: list | None = None  # (key, processor), once the driver has described them
        self._engine, self._autocommit = engine, engine.dialect.name == "postgresql"
        self.blocks = dialect.name != "sqlite"  # a network round trip (SQLite reads a local file, WAL: never waits)

    def read(self, job_id: str, tenant_id: str) -> JobRow | None:
        if "\x00" in job_id:  # no job's id; PostgreSQL would refuse the text (a 500 here: found by the soak)
            return None
        try:
            return self._read(job_id, tenant_id)
        except _Disconnected:
            # The database dropped our pooled connections (a restart): the driver's own error, which
            # SQLAlchemy never saw, so nothing invalidated the pool. Replace it and read once more
            # (before, each replica's first reads after a restart were 500s: found by the soak).
            self._engine.dispose(close=False)
            try:
                return self._read(job_id, tenant_id)
            except _Disconnected as again:  # dropped again: SQLAlchemy's disconnect error, as a Connection raises
                raise DBAPIError.instance(self.sql, None, again.driver_error, self._engine.dialect.loaded_dbapi.Error,
                                          connection_invalidated=True) from again.driver_error

    def _read(self, job_id: str, tenant_id: str) -> JobRow | None:
        try:
            conn = self._engine.raw_connection()  # from the pool
        except self._engine.dialect.loaded_dbapi.OperationalError as exc:  # the driver's: SQLAlchemy wraps none here
            raise unreachable(exc) from exc  # as a Connection would raise it (service/db/connection_errors.py)
        driver = None
        try:
            driver = conn.driver_connection
            assert driver is not None, "a connection checked out of the pool has its driver's connection"
            if self._autocommit:  # a single SELECT: no BEGIN and ROLLBACK round trips
                driver.autocommit = True
            with closing(conn.cursor()) as cursor:
                cursor.execute(self.sql, self._params(job_id, tenant_id))
                raw = cursor.fetchone()
                if self._columns is None:
                    self._columns = self._processors(cursor.description)
            if self._autocommit:
                driver.autocommit = False  # as the pool's other users expect it
        except BaseException as exc:
            dropped = isinstance(exc, Exception) and self._engine.dialect.is_disconnect(exc, driver, None)  # type: ignore[arg-type]
            conn.invalidate()  # never back to the pool in an unknown state (a broken link, autocommit on)
            if dropped and isinstance(exc, Exception):
                raise _Disconnected(exc) from exc
            raise
        finally:
            conn.close()  # back to the pool, or discarded if invalidated
        if raw is None:
            return None
        return JobRow((key, process(value) if process and value is not None else value)
                      for (key, process), value in zip(self._columns, raw))

    def _processors(self, description) -> list:
        dialect = self._engine.dialect
        return [(key, impl.result_processor(dialect, column[1]))  # column[1]: the driver's type code
                for (key, impl), column in zip(self._types, description)]
