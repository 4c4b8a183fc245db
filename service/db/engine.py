"""Engine and session setup, and Alembic migrations applied at start-up.

SQLite (the embedded default, under TRAINYARD_HOME) runs in WAL mode with a
busy timeout so API threads and the control loop can write side by side.
PostgreSQL is selected by TRAINYARD_DATABASE_URL.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

import service.leases  # noqa: F401  (the leases table's model lives with the lease logic; register it)

MIGRATIONS = Path(__file__).parent / "migrations"
SQLITE_BUSY_TIMEOUT_MS = 30_000


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
                               pool_size=20, max_overflow=20)
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    # No pre-ping (a round trip per checkout); connections are recycled instead.
    return create_engine(url, pool_size=20, max_overflow=20, pool_recycle=1800)


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cur.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: durable across process crashes
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


class Sessions:
    """`sessions()` opens a session for reading; `with sessions.begin() as s:` is one write
    transaction (committed at the end, rolled back on error).

    SQLite allows one writer at a time and its busy handler backs off by sleeping, which
    makes tail latency under concurrent writes poor; writers in this process therefore
    queue on a lock instead. PostgreSQL needs no such lock.
    """

    def __init__(self, engine: Engine):
        self.maker = sessionmaker(engine, expire_on_commit=False)
        self.engine = engine
        self._write_lock = threading.Lock() if engine.dialect.name == "sqlite" else None

    def __call__(self) -> Session:
        return self.maker()

    @contextmanager
    def begin(self):
        if self._write_lock is None:
            with self.maker.begin() as s:
                yield s
            return
        with self._write_lock, self.maker.begin() as s:
            yield s


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
