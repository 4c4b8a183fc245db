"""GET /v1/jobs/{job_id}, the API's hottest call, answered without FastAPI's routing, dependency
solving and response classes.

Every `--follow` and every dashboard polls it. On a small machine the framework costs several
times the read itself, so this plain ASGI middleware answers the ordinary success directly: a
token already in the token cache (so checked within `AUTH_CACHE_S`), unexpired, with the `read`
scope, within its rate limit, asking for one of its tenant's jobs. Everything else (a token not
in the cache, a missing scope, another tenant's or a missing job, a rate-limited token, a database
error) goes on to the full app, which alone words every error: the two paths cannot disagree.
The answer is the full route's, byte for byte (tests/api/test_job_read_fast_path.py).
"""

from __future__ import annotations

from types import SimpleNamespace

import orjson
from anyio import to_thread

from api.http.deps import token_cache
from api.http.schemas import job_out
from service.db.tenants import hash_token

PREFIX = "/v1/jobs/"
ROUTE = SimpleNamespace(path=PREFIX + "{job_id}")  # what api/http/request_metrics.py labels a request by
HEADERS = [(b"content-type", b"application/json")]


class JobReadFastPath:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "GET" and scope["path"].startswith(PREFIX):
            body = await self._answer(scope)
            if body is not None:
                scope["route"] = ROUTE
                await send({"type": "http.response.start", "status": 200,
                            "headers": [(b"content-length", str(len(body)).encode()), *HEADERS]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)

    async def _answer(self, scope) -> bytes | None:
        """The job's JSON, or None for anything but the plain success."""
        job_id = scope["path"][len(PREFIX):]
        if not job_id or "/" in job_id:
            return None
        token = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                if scheme.lower() != "bearer":
                    return None
            elif (name == b"content-length" and value != b"0") or name == b"transfer-encoding":
                return None  # a GET with a body: the full app's limits apply
        principal = token and token_cache.get(hash_token(token.strip()))
        if not principal or "read" not in principal.scopes or principal.expired():
            return None
        app = scope["app"]
        limiter = getattr(app.state, "rate_limiter", None)
        if limiter is not None and limiter.take(principal.token_id) is not None:
            return None  # refused: the full app says so (a refused take spends nothing)
        reader = app.state.plane.job_reader
        try:
            if reader.blocks:  # a network round trip: off the event loop
                row = await to_thread.run_sync(reader.read, job_id, principal.tenant_id)
            else:
                row = reader.read(job_id, principal.tenant_id)
        except Exception:  # noqa: BLE001 - the full app reads again and answers the error
            return None
        return None if row is None else orjson.dumps(job_out(row))
