"""A database that is down or restarting is a short wait for a read and an honest 503, never a 500.

A read (GET, HEAD) that met a database connection error before any of its answer was sent
(service/db/connection_errors.py: the database dropped a pooled connection, or could not be
reached) is run again: at once (a restart's dropped connection: SQLAlchemy has invalidated the
pool, so the next run connects afresh), then after 0.1 s, doubling to 1 s, on the event loop
(asyncio.sleep: other requests go on), until it succeeds or TRAINYARD_DB_UNAVAILABLE_WAIT_S has
passed since the first error; then it is a 503 with Retry-After in the error schema. A pg_ctl
restart (1-4 s) is waited out; a long outage says so. Before, the soak's reads during a restart
were 500s (bench/soak, docs/ha.md).

A write with an Idempotency-Key is run again the same way: a run that met the error wrote nothing
(a failed connect sent nothing; a dropped connection's open transaction is rolled back by the
database), and if a connection was lost during COMMIT itself the key answers the next run with
the job it made, never a second one. So a submit during a restart waits it out too (the soak's
submits all carry a key). Any other write is not run again: its error is a 503 at once.

Plain ASGI middleware inside the request metrics (api/http/request_metrics.py, which so counts
one request with its final status and its whole time, waits included) and outside the job read
fast path (whose database errors go to the full app) and the audit log (which records a write's
503 as this answers it: api/http/audit.py). Other errors go on out, to api/http/server_errors.py.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time

from api.http.errors import error_response
from api.http.response_tracker import ResponseTracker
from service.db.connection_errors import lost_database

log = logging.getLogger("trainyard.api")
READS = ("GET", "HEAD")
IDEMPOTENCY_HEADER = b"idempotency-key"  # ASGI header names are lower-case
FIRST_BACKOFF_S, MAX_BACKOFF_S = 0.1, 1.0
DATABASE_UNAVAILABLE = "database: unavailable (down or restarting); retry after the Retry-After seconds"


def unavailable_response(retry_after_s: float):
    return error_response(503, DATABASE_UNAVAILABLE, headers={"Retry-After": str(max(1, math.ceil(retry_after_s)))})


class DatabaseOutageMiddleware:
    def __init__(self, app, wait_s: float):
        self.app, self.wait_s = app, wait_s

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        tracked = ResponseTracker(send)
        if not _safe_to_repeat(scope):
            try:
                return await self.app(scope, receive, tracked)
            except Exception as exc:
                if not lost_database(exc) or tracked.started:
                    raise
                log.warning("%s %s: the database is unavailable (%s); answering 503", scope["method"],
                            scope["path"], _why(exc))
                return await unavailable_response(self.wait_s)(scope, receive, send)

        received: list[dict] = []  # what a run read of the request, for the next run to read again
        deadline, backoff = None, 0.0
        while True:
            try:
                return await self.app(scope, _replaying(received, receive), tracked)
            except Exception as exc:
                if not lost_database(exc) or tracked.started:
                    raise
                now = time.monotonic()
                if deadline is None:
                    deadline = now + self.wait_s
                    log.warning("%s %s: the database is unavailable (%s); reading again for up to %g s",
                                scope["method"], scope["path"], _why(exc), self.wait_s)
                elif now >= deadline:
                    log.warning("%s %s: the database is still unavailable after %g s (%s); answering 503",
                                scope["method"], scope["path"], self.wait_s, _why(exc))
                    return await unavailable_response(self.wait_s)(scope, receive, send)
                await asyncio.sleep(min(backoff, max(0.0, deadline - now)))
                backoff = min(MAX_BACKOFF_S, max(FIRST_BACKOFF_S, backoff * 2))


def _safe_to_repeat(scope) -> bool:
    """A read, or a write the service answers once per key (api/http: Idempotency-Key)."""
    return scope["method"] in READS or any(name == IDEMPOTENCY_HEADER for name, _ in scope.get("headers", ()))


def _replaying(received: list[dict], receive):
    """A run's `receive`: the messages earlier runs read, then (recorded for later runs) the server's."""
    index = 0

    async def replaying():
        nonlocal index
        if index == len(received):
            received.append(await receive())
        index += 1
        return received[index - 1]

    return replaying


def _why(exc: BaseException) -> str:
    """For the log: the driver's error class, e.g. psycopg.OperationalError or psycopg.errors.AdminShutdown."""
    kind = type(getattr(exc, "orig", None) or exc)
    return f"{kind.__module__}.{kind.__qualname__}"
