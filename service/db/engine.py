"""Engine and session setup, and Alembic migrations applied at start-up.

SQLite (the embedded default, under TRAINYARD_HOME) runs in WAL mode with a
busy timeout so API threads and the control loop can write side by side.
PostgreSQL is selected by TRAINYARD_DATABASE_URL.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Protocol

import orjson
from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from service.db.connection_errors import raise_connect_failures_as_unreachable

MIGRATIONS = Path(__file__).parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 30_000
PG_CONNECT_TIMEOUT_S = 5


def _json_loads(text: str):
    """orjson reads a job's JSON columns several times faster; the stdlib still reads what only
    it accepts (NaN, which older rows may hold)."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
                               pool_size=20, max_overflow=20, json_deserializer=_json_loads)
        event.listen(engine, "connect", _sqlite_pragmas)
    else:
        # No pre-ping (a round trip per checkout); connections are recycled instead. A bounded connect:
        # a database host that drops packets fails a connect in seconds, not after the kernel's
        # TCP retries (minutes), so a request waits out an outage on its own deadline.
        engine = create_engine(url, pool_size=20, max_overflow=20, pool_recycle=1800, json_deserializer=_json_loads,
                               connect_args={"connect_timeout": PG_CONNECT_TIMEOUT_S})
    raise_connect_failures_as_unreachable(engine)  # a database down or restarting: its own error type
    return engine


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across process crashes
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


class WriteLock:
    """SQLite's writers queue here: a thread lock, and a lock on a file beside the database for
    the other processes of `trainyard serve --workers`. The kernel wakes the next waiter at once."""

    def __init__(self, database: str | None):
        self._thread_lock = threading.Lock()
        self._fd = None
        if database and database != ":memory:":
            self._fd = os.open(f"{database}.write-lock", os.O_RDWR | os.O_CREAT, 0o600)

    def __enter__(self):
        self._thread_lock.acquire()
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_EX)

    def __exit__(self, *exc):
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._thread_lock.release()


class Sessions:
    """`sessions()` opens a session for reading; `with sessions.begin() as s:` is one write
    transaction (committed at the end, rolled back on error).

    SQLite allows one writer at a time and its busy handler backs off by sleeping, which
    makes tail latency under concurrent writes poor; writers therefore queue on a lock
    instead. PostgreSQL needs no such lock.
    """

    def __init__(self, engine: Engine):
        self.maker = sessionmaker(engine, expire_on_commit=False)
        self.engine = engine
        self._write_lock = WriteLock(engine.url.database) if engine.dialect.name == "sqlite" else None

    def __call__(self) -> Session:
        return self.maker()

    @contextmanager
    def begin(self) -> Iterator[Session]:
        if self._write_lock is None:
            with self.maker.begin() as s:
                yield s
            return
        with self._write_lock, self.maker.begin() as s:
            yield s


class SessionSource(Protocol):
    """What the scheduler and reconciler open sessions from: `Sessions`, or the lease-fenced
    `FencedSessions` (service/leases.py)."""

    def __call__(self) -> Session: ...

    def begin(self) -> AbstractContextManager[Session]: ...


def make_sessionmaker(engine: Engine) -> Sessions:
    return Sessions(engine)


def alembic_config(engine: Engine) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["engine"] = engine
    return cfg


def migrate(engine: Engine) -> None:
    """Bring the schema to the latest revision (idempotent)."""
    command.upgrade(alembic_config(engine), "head")
