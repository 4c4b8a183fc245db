"""The leader lease: which `trainyard serve` replica runs the scheduler and reconciler.

Several replicas may serve the API on one PostgreSQL database, but only the
holder of the `control` lease admits and reconciles jobs. The lease is one row
(holder, fencing token, expiry). A replica takes it when it is free or expired,
and every take-over increments the token. The holder renews it from a heartbeat
thread; every write the scheduler and reconciler make first reads the token under
a share lock (`FencedSessions`), so a replica that lost the lease (paused, cut
off, too slow to renew) cannot write once a successor holds it: its transaction
sees a newer token and rolls back, and the successor's take-over waits for any
transaction still holding the share lock.

SQLite supports one control-plane replica: a second one pointed at the same file
is refused at start-up while the first lives (a holder that died on this host is
replaced at once, so a restart after a crash does not wait for the expiry).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import select, text
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session

from service.db.engine import Sessions
from service.db.models import LeaseRow

log = logging.getLogger("trainyard.lease")
CONTROL = "control"


class LeaseLost(RuntimeError):
    """This replica no longer holds the lease: the write it was about to make is abandoned."""


class LeaseHeld(RuntimeError):
    """Another live replica holds the lease (raised where only one replica may run: SQLite)."""


def replica_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def _db_now(s: Session) -> float:
    """The database's clock on PostgreSQL (one clock for all replicas); this host's on SQLite."""
    assert s.bind is not None, "sessions come from a sessionmaker bound to the engine"
    if s.bind.dialect.name == "postgresql":
        return float(s.execute(text("SELECT extract(epoch FROM clock_timestamp())")).scalar_one())
    return time.time()


def _dead_here(holder: str, me: str) -> bool:
    """The holder was a process on this host that no longer runs (our own pid under another
    name: an earlier process that had it, e.g. PID 1 of a restarted container)."""
    host, _, rest = holder.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    if int(pid) == os.getpid():
        return holder != me
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class LeaderLease:
    def __init__(self, sessions: Sessions, ttl_s: float, holder: str | None = None, name: str = CONTROL):
        self.sessions, self.ttl_s, self.name = sessions, ttl_s, name
        self.holder = holder or replica_id()
        self.token: int | None = None
        self._valid_until = 0.0  # monotonic: after this, act as if the lease were lost
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.current_holder: str | None = None  # who holds it, as last read (for /readyz and logs)

    # --- taking and renewing -----------------------------------------------

    def try_acquire(self) -> bool:
        """Take the lease if free or expired, renew it if ours. True while this replica holds it."""
        started = time.monotonic()
        try:
            with self.sessions.begin() as s:
                row = s.scalar(select(LeaseRow).where(LeaseRow.name == self.name).with_for_update())
                now = _db_now(s)
                if row is None:
                    row = LeaseRow(name=self.name, holder=self.holder, token=1, expires_at=now + self.ttl_s)
                    s.add(row)
                    s.flush()
                elif row.holder == self.holder and row.token == self.token:
                    row.expires_at = now + self.ttl_s
                elif row.expires_at <= now or (self.sessions.engine.dialect.name == "sqlite"
                                               and _dead_here(row.holder, self.holder)):
                    log.warning("taking the control lease from %s (token %d -> %d)", row.holder, row.token,
                                row.token + 1)
                    row.holder, row.token, row.expires_at = self.holder, row.token + 1, now + self.ttl_s
                else:
                    self.current_holder = row.holder
                    self._lose()
                    return False
                token = row.token
        except (IntegrityError, DBAPIError) as exc:  # a concurrent first insert, or SQLite busy: not ours this time
            log.info("lease not taken this time: %s", type(exc).__name__)
            if time.monotonic() > self._valid_until:
                self._lose()
            return self.held()
        if self.token != token:
            log.warning("this replica (%s) now leads the control plane, fencing token %d", self.holder, token)
        self.token, self.current_holder = token, self.holder
        # Our clock started before the database's did: ending a fifth early keeps us inside its expiry.
        self._valid_until = started + self.ttl_s * 0.8
        return True

    def held(self) -> bool:
        return self.token is not None and time.monotonic() < self._valid_until

    def _lose(self) -> None:
        if self.token is not None:
            log.warning("this replica (%s) lost the control lease (token %d)", self.holder, self.token)
        self.token = None

    def release(self) -> None:
        """A clean stop hands the lease on at once instead of after its expiry."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.token is None:
            return
        try:
            with self.sessions.begin() as s:
                row = s.scalar(select(LeaseRow).where(LeaseRow.name == self.name).with_for_update())
                if row is not None and row.holder == self.holder and row.token == self.token:
                    row.expires_at = 0.0
        except Exception as exc:
            log.warning("releasing the lease failed (it expires by itself): %s", exc)
        self.token = None

    def keep_renewed(self) -> None:
        """Renew from a thread of its own, so a long control-loop tick never lets the lease lapse."""
        def beat():
            while not self._stop.wait(self.ttl_s / 4):
                if self.token is not None:
                    try:
                        self.try_acquire()
                    except Exception as exc:  # database away: held() runs out by itself
                        log.warning("renewing the lease failed: %s", exc)
        self._thread = threading.Thread(target=beat, name="trainyard-lease", daemon=True)
        self._thread.start()

    # --- fencing -------------------------------------------------------------

    def check(self, s: Session) -> None:
        """Inside a write transaction: go on only if the database still names our token."""
        if not self.held():
            raise LeaseLost(f"replica {self.holder} does not hold the control lease")
        token = s.scalar(select(LeaseRow.token).where(LeaseRow.name == self.name).with_for_update(read=True))
        if token != self.token:
            self._lose()
            raise LeaseLost(f"the control lease moved on (token {token}, ours {self.token})")


class FencedSessions:
    """The scheduler's and reconciler's sessions: reads as usual; every write transaction first
    checks the fencing token (LeaseLost aborts it before anything is written)."""

    def __init__(self, sessions: Sessions, lease: LeaderLease):
        self.sessions, self.lease = sessions, lease
        self.engine = sessions.engine

    def __call__(self) -> Session:
        return self.sessions()

    @contextmanager
    def begin(self) -> Iterator[Session]:
        with self.sessions.begin() as s:
            self.lease.check(s)
            yield s

    def still_leading(self) -> bool:
        return self.lease.held()
