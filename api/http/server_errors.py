"""The last resort: an exception that escapes every handler becomes the JSON 500, and the connection lives on.

Starlette's ServerErrorMiddleware (where an `exception_handler(Exception)` runs) sends the 500
and then re-raises, for the server to log; uvicorn, seeing the exception after a response
began, closes the connection, so a keep-alive client's next request failed too. This plain
ASGI middleware, the outermost one we add (inside ServerErrorMiddleware), logs the error once
with its traceback, answers the 500 in the error schema and returns normally. The middlewares
inside it count the 500 as they see it pass: the request metrics (a request that raised is a
500) and the audit log (api/http/audit.py records a call that raised as a 500).

One error is retried instead: a read (GET, HEAD) that met a pooled database connection the
database had dropped (a PostgreSQL restart; the pool has no pre-ping, see service/db/engine.py).
SQLAlchemy then invalidates the whole pool, so the second run gets a fresh connection; before this,
every replica answered its first reads after a restart with 500s (found by the soak, bench/soak).
Writes are not re-run here: their own paths decide what is safe to repeat.
"""

from __future__ import annotations

import logging

from sqlalchemy.exc import DBAPIError

from api.http.errors import INTERNAL_ERROR, error_response
from api.http.response_tracker import ResponseTracker

log = logging.getLogger("trainyard.api")


class UnexpectedErrorMiddleware:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        tracked = ResponseTracker(send)
        received: list[dict] = []  # what the first run read of the request, for a second run to read again

        async def recording():
            message = await receive()
            received.append(message)
            return message

        async def replaying():
            return received.pop(0) if received else await receive()

        try:
            try:
                await self.app(scope, recording, tracked)
            except DBAPIError as exc:
                if not (exc.connection_invalidated and scope["method"] in ("GET", "HEAD") and not tracked.started):
                    raise
                log.warning("%s %s: the database dropped a pooled connection; reading again", scope["method"],
                            scope["path"])
                await self.app(scope, replaying, tracked)
        except Exception:
            log.exception("unhandled error on %s %s", scope["method"], scope["path"])
            if not tracked.started:  # else part of an answer is out: uvicorn closes the incomplete response itself
                await error_response(500, INTERNAL_ERROR)(scope, receive, send)
