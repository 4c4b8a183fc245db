"""API tokens (admin scope): create (the secret is shown once), list (no secrets), revoke."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Annotated, Literal

from fastapi import APIRouter, Body, Path, Query, Request
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from api.http.deps import AdminDep, PlaneDep, SessionDep, token_cache
from api.http.errors import ApiError
from api.http.routers.tenants import tenant_or_404
from api.http.schemas import token_out
from service import tenancy
from service.db.tenants import NotFound

router = APIRouter(prefix="/v1/tokens", tags=["admin"])
Scope = Literal["read", "submit", "admin"]
MAX_LIFETIME = timedelta(days=10 * 365)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class TokenIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tenant: str = Field(min_length=1, max_length=64, description="tenant id or name")
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9 ._@-]+$", description="what the token is for")
    scopes: list[Scope] = Field(min_length=1, description="any of read, submit, admin")
    expires_at: AwareDatetime | None = Field(None, description="when it stops working (with a timezone)")
    ttl_s: int | None = Field(None, ge=1, le=int(MAX_LIFETIME.total_seconds()),
                              description="or: seconds from now until it expires")

    @model_validator(mode="after")
    def _one_expiry(self):
        if self.expires_at is not None and self.ttl_s is not None:
            raise ValueError("expires_at and ttl_s: give at most one of them")
        if self.expires_at is not None and not utcnow() < self.expires_at < utcnow() + MAX_LIFETIME:
            raise ValueError("expires_at: must be in the future and at most 10 years away")
        return self

    def expiry(self) -> datetime | None:
        if self.ttl_s:
            return utcnow() + timedelta(seconds=self.ttl_s)
        return self.expires_at.astimezone(timezone.utc) if self.expires_at else None  # stored as UTC


@router.post("", status_code=201)
def create_token(body: Annotated[TokenIn, Body()], request: Request, plane: PlaneDep, _: AdminDep) -> dict:
    """A new token for a tenant. The secret is in this answer only; the service keeps its hash."""
    with plane.sessions.begin() as s:
        tenant = tenant_or_404(s, body.tenant)
        row, secret = tenancy.create_token(s, tenant, body.name, body.scopes, body.expiry())
        request.state.audit_target, request.state.audit_target_tenant = str(row.id), tenant.id
        return {**token_out(row), "token": secret}


@router.get("")
def list_tokens(s: SessionDep, _: AdminDep,
                tenant: Annotated[str | None, Query(description="only this tenant's (id or name)")] = None) -> dict:
    tenant_id = tenant_or_404(s, tenant).id if tenant else None
    return {"tokens": [token_out(t) for t in tenancy.list_tokens(s, tenant_id)]}


@router.delete("/{token_id}")
def revoke_token(token_id: Annotated[int, Path(ge=1, le=2**31 - 1)], request: Request, plane: PlaneDep,
                 principal: AdminDep) -> dict:
    """Revoke a token: refused at once on this replica, within TRAINYARD_AUTH_CACHE_S on others.
    Not the token of this very call (409): an admin cannot lock itself out by mistake."""
    if token_id == principal.token_id:
        raise ApiError(409, f"token_id: token {token_id} is the one this request uses; revoke it with another "
                            "admin token", [{"field": "token_id", "message": "the calling token cannot revoke itself"}])
    try:
        with plane.sessions.begin() as s:
            row = tenancy.revoke_token(s, token_id)
            request.state.audit_target_tenant = row.tenant_id
            out = token_out(row)
    except NotFound as exc:
        raise ApiError(404, str(exc)) from None
    token_cache.clear()  # this replica forgets every cached token: the revoked one is looked up again
    return out
