"""The audit log: one record per state-changing call by an authenticated caller, as plain ASGI middleware.

Who (tenant, token id and name), what (an action named after the route), when, on what
(the target the router names, else the path's ids) and how it ended (the HTTP status,
and the error message of a refused call). Written before the last byte of the response
leaves, so a client that has its answer can already read the record. Calls refused for
lack of a valid token (401) or by the rate limit are not recorded: they name no one, or
would turn a flood of requests into a flood of writes.
"""

from __future__ import annotations

import asyncio
import json
import logging

from api.http.database_outage import DATABASE_UNAVAILABLE
from api.http.errors import INTERNAL_ERROR
from service.admission.audit import SUBMIT, audit_record, write_audit
from service.db.connection_errors import lost_database

log = logging.getLogger("trainyard.audit")
CHANGING = {"POST", "PUT", "PATCH", "DELETE"}
ACTIONS = {
    ("POST", "/v1/jobs"): SUBMIT,
    ("POST", "/v1/jobs/{job_id}/cancel"): "job.cancel",
    ("POST", "/v1/code"): "code.upload",
    ("POST", "/v1/tenants"): "tenant.create",
    ("PATCH", "/v1/tenants/{tenant_id}"): "tenant.update",
    ("POST", "/v1/tokens"): "token.create",
    ("DELETE", "/v1/tokens/{token_id}"): "token.revoke",
}
UNAUDITED = {"/v1/plans"}  # dry runs: nothing changes
# A handler that writes its own record in its transaction (a submit: service/admission/submit.py)
# sets `request.state.audited`.


class AuditMiddleware:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in CHANGING or not scope["path"].startswith("/v1/"):
            return await self.app(scope, receive, send)
        status, body, recorded = 500, bytearray(), False

        async def auditing_send(message):
            nonlocal status, recorded
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                if status >= 400 and len(body) < 4096:
                    body.extend(message.get("body", b""))
                if not message.get("more_body", False):
                    recorded = True
                    await self._record(scope, status, bytes(body))
            await send(message)

        try:
            await self.app(scope, receive, auditing_send)
        except Exception as exc:
            if not recorded:  # answered outside, as recorded here: a database outage is a 503, any other fault a 500
                status, detail = ((503, DATABASE_UNAVAILABLE) if lost_database(exc)  # api/http/database_outage.py
                                  else (500, INTERNAL_ERROR))  # api/http/server_errors.py
                await self._record(scope, status, json.dumps({"detail": detail}).encode())
            raise

    async def _record(self, scope, status: int, body: bytes) -> None:
        state = scope.get("state") or {}
        principal = state.get("principal")
        route = getattr(scope.get("route"), "path", None)
        if principal is None or state.get("rate_limited") or route in UNAUDITED or state.get("audited"):
            return
        detail = ""
        if status >= 400:
            try:
                detail = str(json.loads(body).get("detail", ""))[:1000]
            except (ValueError, AttributeError):
                detail = body[:200].decode(errors="replace")
        params = scope.get("path_params") or {}
        method, path = scope["method"], route or scope["path"]
        record = audit_record(principal, ACTIONS.get((method, path), f"{method} {path}"), status,
                              state.get("audit_target") or next(iter(params.values()), ""), detail,
                              state.get("audit_target_tenant",
                                        principal.tenant_id if (route or "").startswith("/v1/jobs") else None))
        plane = scope["app"].state.plane
        try:
            await asyncio.wrap_future(write_audit(plane.writes, record))
        except Exception:  # the call itself is done; a lost audit record is logged, not a failed request
            log.exception("writing the audit record %s failed", record)
