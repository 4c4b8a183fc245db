"""Tenants and their API tokens: creating and finding tenants, issuing, listing and revoking tokens,
and resolving a presented secret to its token row (only its SHA-256 is stored). Like
service/db/repository.py, each function takes a Session and leaves committing to the caller.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from collections.abc import Iterable
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db.models import ApiToken, Tenant, utcnow
from service.db.repository import aware
from service.refusals import Conflict


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return "ty_" + secrets.token_urlsafe(32)


SCOPES = ("read", "submit", "admin")
ADMIN_TENANT = "admin"  # the bootstrap admin token's tenant


class NotFound(Exception):
    pass


def ensure_tenant(s: Session, name: str, **fields) -> Tenant:
    tenant = s.scalar(select(Tenant).where(Tenant.name == name))
    if tenant is None:
        fields.setdefault("allow_user_code", name == ADMIN_TENANT)  # the operator's own tenant may run user code
        tenant = Tenant(id=uuid.uuid4().hex[:16], name=name, **fields)
        s.add(tenant)
        s.flush()
    return tenant


def ensure_token(s: Session, tenant: Tenant, token: str, name: str, is_admin: bool) -> None:
    digest = hash_token(token)
    if s.scalar(select(ApiToken.id).where(ApiToken.token_sha256 == digest)) is None:
        scopes = SCOPES if is_admin else ("read", "submit")
        s.add(ApiToken(tenant_id=tenant.id, token_sha256=digest, name=name, is_admin=is_admin, scopes=",".join(scopes)))
        s.flush()


def create_tenant(s: Session, name: str, **fields) -> tuple[Tenant, str]:
    """A new tenant with its first (read + submit) token; the token is returned once and stored hashed."""
    if s.scalar(select(Tenant.id).where(Tenant.name == name)) is not None:
        raise Conflict(f"name: tenant {name!r} already exists")
    tenant = ensure_tenant(s, name, **fields)
    token = new_token()
    ensure_token(s, tenant, token, "default", is_admin=False)
    return tenant, token


def find_tenant(s: Session, id_or_name: str) -> Tenant | None:
    return s.scalar(select(Tenant).where((Tenant.id == id_or_name) | (Tenant.name == id_or_name)))


def list_tenants(s: Session) -> list[Tenant]:
    return list(s.scalars(select(Tenant).order_by(Tenant.created_at, Tenant.id)))


def create_token(s: Session, tenant_id: str, name: str, scopes: Iterable[str], expires_at) -> tuple[ApiToken, str]:
    """A new token for the tenant; the secret is returned once, only its hash is stored."""
    scopes = [x for x in SCOPES if x in set(scopes)]
    secret = new_token()
    row = ApiToken(tenant_id=tenant_id, token_sha256=hash_token(secret), name=name, is_admin="admin" in scopes,
                   scopes=",".join(scopes), expires_at=expires_at)
    s.add(row)
    s.flush()
    return row, secret


def list_tokens(s: Session, tenant_id: str | None = None) -> list[ApiToken]:
    q = select(ApiToken)
    if tenant_id is not None:
        q = q.where(ApiToken.tenant_id == tenant_id)
    return list(s.scalars(q.order_by(ApiToken.id)))


def revoke_token(s: Session, token_id: int) -> ApiToken:
    row = s.get(ApiToken, token_id, with_for_update=True)
    if row is None:
        raise NotFound(f"token {token_id} not found")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
    return row


def token_usable(row: ApiToken, now: datetime | None = None) -> bool:
    expires = aware(row.expires_at)
    return row.revoked_at is None and (expires is None or expires > (now or utcnow()))


def token_row(s: Session, token: str) -> ApiToken | None:
    """The token row of a presented secret, live or not."""
    return s.scalar(select(ApiToken).where(ApiToken.token_sha256 == hash_token(token)))


def find_token(s: Session, token: str) -> ApiToken | None:
    """The live (not revoked, not expired) token row for a presented secret."""
    row = token_row(s, token)
    return row if row is not None and token_usable(row) else None


def lookup_token(s: Session, token: str) -> tuple[str, bool] | None:
    row = find_token(s, token)
    return (row.tenant_id, bool(row.is_admin)) if row else None
