"""Annotated dependencies: the control plane, a DB session, the calling principal and its scopes.

A presented token is looked up by its hash and trusted for `auth_cache_s` (a short time:
that bounds how late another replica sees a revocation; on the replica that revokes, the
cache is cleared at once). Expiry is checked on every request, cached or not.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Annotated

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session

from api.http.errors import ApiError
from service import job_queries, tenancy
from service.control import ControlPlane
from service.db.tenants import hash_token
from service.records import JobRecord, Principal


# The cheap dependencies are `async def`: FastAPI runs a plain `def` dependency in the thread
# pool, and that hop costs more than the work.
async def get_plane(request: Request) -> ControlPlane:
    return request.app.state.plane


PlaneDep = Annotated[ControlPlane, Depends(get_plane)]


def get_session(plane: PlaneDep):
    with plane.sessions() as s:
        yield s


SessionDep = Annotated[Session, Depends(get_session)]


class TokenCache:
    """Token hash -> (principal, monotonic deadline). Never holds a plain token."""

    def __init__(self):
        self._entries: dict[str, tuple[Principal, float]] = {}
        self._lock = threading.Lock()

    def get(self, key: str) -> Principal | None:
        entry = self._entries.get(key)
        return entry[0] if entry and entry[1] > time.monotonic() else None

    def put(self, key: str, principal: Principal, ttl_s: float) -> None:
        with self._lock:
            if len(self._entries) > 10_000:  # bounded: forged tokens are never cached, but be safe
                self._entries.clear()
            self._entries[key] = (principal, time.monotonic() + ttl_s)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


token_cache = TokenCache()
UNAUTHORIZED = {"WWW-Authenticate": "Bearer"}


def _lookup(plane: ControlPlane, token: str) -> Principal | str:
    """The principal, or why the token is refused."""
    with plane.sessions() as s:
        return tenancy.authenticate(s, token)


async def get_principal(request: Request, plane: PlaneDep) -> Principal:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        raise ApiError(401, "authorization: missing bearer token (send 'Authorization: Bearer <token>')",
                       headers=UNAUTHORIZED)
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "authorization: must be 'Bearer <token>'", headers=UNAUTHORIZED)
    token = token.strip()
    key = hash_token(token)
    principal = token_cache.get(key)
    if principal is None:
        found = await run_in_threadpool(_lookup, plane, token)
        if isinstance(found, str):
            raise ApiError(401, found, headers=UNAUTHORIZED)
        principal = found
        token_cache.put(key, principal, plane.settings.auth_cache_s)
    if principal.expired():
        raise ApiError(401, f"authorization: token expired at {principal.expires_at.isoformat()}", headers=UNAUTHORIZED)
    limiter = getattr(request.app.state, "rate_limiter", None)
    if limiter is not None and (wait := limiter.take(principal.token_id)) is not None:
        request.state.rate_limited = True  # not audited: a flood must not become a flood of writes
        raise ApiError(429, f"rate limit: this token may send {limiter.rate:g} requests per second "
                            f"(bursts of {limiter.burst}); retry in {wait:.2f} s",
                       headers={"Retry-After": str(max(1, math.ceil(wait)))})
    request.state.principal = principal  # for the audit log
    return principal


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def require(scope: str):
    """A dependency that lets the call through only with a token holding `scope`."""

    async def check(principal: PrincipalDep) -> Principal:
        if scope not in principal.scopes:
            msg = (f"forbidden: this call needs the '{scope}' scope; this token has "
                   f"{sorted(principal.scopes) or 'none'}")
            raise ApiError(403, msg, [{"field": "scope", "message": msg}])
        return principal

    check.__name__ = f"require_{scope}"
    return check


_READ, _SUBMIT = require("read"), require("submit")


async def require_by_method(request: Request, principal: PrincipalDep) -> Principal:
    """Reads need `read`; anything that changes a job (submit, cancel) needs `submit`."""
    return await (_READ if request.method in ("GET", "HEAD") else _SUBMIT)(principal)


AdminDep = Annotated[Principal, Depends(require("admin"))]


def job_or_404(s: Session, job_id: str, principal: Principal) -> JobRecord:
    """Another tenant's job is indistinguishable from a missing one."""
    job = job_queries.get_job(s, job_id, principal.tenant_id)
    if job is None:
        raise job_not_found(job_id)
    return job


def job_not_found(job_id: str) -> ApiError:
    return ApiError(404, f"job {job_id!r} not found")
