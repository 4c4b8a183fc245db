"""The last resort: an exception that escapes every handler becomes the JSON 500, and the connection lives on.

Starlette's ServerErrorMiddleware (where an `exception_handler(Exception)` runs) sends the 500
and then re-raises, for the server to log; uvicorn, seeing the exception after a response
began, closes the connection, so a keep-alive client's next request failed too. This plain
ASGI middleware, the outermost one we add (inside ServerErrorMiddleware), logs the error once
with its traceback, answers the 500 in the error schema and returns normally. The middlewares
inside it count the 500 as they see it pass: the request metrics (a request that raised is a
500) and the audit log (api/http/audit.py records a call that raised as a 500).

A database connection error never gets here unless part of its answer had been sent: a read is
run again while the database restarts, and a longer outage or a write meeting one is a 503
(api/http/database_outage.py, inside the request metrics).
"""

from __future__ import annotations

import logging

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
        try:
            await self.app(scope, receive, tracked)
        except Exception:
            log.exception("unhandled error on %s %s", scope["method"], scope["path"])
            if not tracked.started:  # else part of an answer is out: uvicorn closes the incomplete response itself
                await error_response(500, INTERNAL_ERROR)(scope, receive, send)
