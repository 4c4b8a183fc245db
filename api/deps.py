"""Annotated dependencies: the control plane, a DB session and the calling principal."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session

from api.errors import ApiError
from service.control import ControlPlane
from service.db import repository as repo

TOKEN_CACHE_TTL_S = 30.0


@dataclass(frozen=True)
class Principal:
    tenant_id: str
    is_admin: bool


def get_plane(request: Request) -> ControlPlane:
    return request.app.state.plane


PlaneDep = Annotated[ControlPlane, Depends(get_plane)]


def get_session(plane: PlaneDep):
    with plane.sessions() as s:
        yield s


SessionDep = Annotated[Session, Depends(get_session)]

_token_cache: dict[str, tuple[Principal, float]] = {}


def _lookup(plane: ControlPlane, token: str) -> Principal | None:
    with plane.sessions() as s:
        found = repo.lookup_token(s, token)
    return Principal(*found) if found else None


async def get_principal(request: Request, plane: PlaneDep) -> Principal:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        raise ApiError(401, "authorization: missing bearer token (send 'Authorization: Bearer <token>')",
                       headers={"WWW-Authenticate": "Bearer"})
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "authorization: must be 'Bearer <token>'", headers={"WWW-Authenticate": "Bearer"})
    token = token.strip()
    key = repo.hash_token(token)  # the cache never holds a plain token
    cached = _token_cache.get(key)
    if cached and cached[1] > time.monotonic():
        return cached[0]
    principal = await run_in_threadpool(_lookup, plane, token)
    if principal is None:
        raise ApiError(401, "authorization: unknown or revoked token", headers={"WWW-Authenticate": "Bearer"})
    _token_cache[key] = (principal, time.monotonic() + TOKEN_CACHE_TTL_S)
    return principal


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def require_admin(principal: PrincipalDep) -> Principal:
    if not principal.is_admin:
        raise ApiError(403, "forbidden: this call needs the admin scope")
    return principal


AdminDep = Annotated[Principal, Depends(require_admin)]


def job_or_404(s: Session, job_id: str, principal: Principal):
    """Another tenant's job is indistinguishable from a missing one."""
    job = repo.get_job(s, job_id, tenant_id=principal.tenant_id)
    if job is None:
        raise ApiError(404, f"job {job_id!r} not found")
    return job
