"""Tenants, their tokens, the callers they authenticate and the audit log, handed out as records.

Each function takes the caller's session (the caller owns the unit of work: a write commits
when its `with sessions.begin():` ends) and returns plain records (service/records.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from sqlalchemy.orm import Session

from service.db import audit_log as audit_repo
from service.db import tenant_usage as usage_repo
from service.db import tenants as tenant_repo
from service.records import AuditEntry, Principal, TenantRecord, TokenRecord, copy_row


def create_tenant(s: Session, name: str, **quotas) -> tuple[TenantRecord, str]:
    """A new tenant and its first token's secret (shown once). Conflict if the name is taken.
    `quotas`: its quotas, its fair-share weight and reserve_after_s (service/queueing/)."""
    tenant, secret = tenant_repo.create_tenant(s, name, **quotas)
    return copy_row(TenantRecord, tenant), secret


def find_tenant(s: Session, id_or_name: str) -> TenantRecord | None:
    tenant = tenant_repo.find_tenant(s, id_or_name)
    return copy_row(TenantRecord, tenant) if tenant is not None else None


def list_tenants(s: Session) -> list[TenantRecord]:
    return [copy_row(TenantRecord, t) for t in tenant_repo.list_tenants(s)]


def tenant_usage(s: Session, tenant_id: str) -> usage_repo.Usage:
    return usage_repo.tenant_usage(s, tenant_id)


def update_tenant(s: Session, id_or_name: str, changes: dict) -> TenantRecord | None:
    """Set the given quota and queueing fields (None lifts a limit, or takes the server's
    reserve_after_s); None if there is no such tenant. The scheduler reads them on its next tick."""
    tenant = tenant_repo.find_tenant(s, id_or_name)
    if tenant is None:
        return None
    for field, value in changes.items():
        setattr(tenant, field, value)
    return copy_row(TenantRecord, tenant)


def create_token(s: Session, tenant: TenantRecord, name: str, scopes: Iterable[str],
                 expires_at: datetime | None) -> tuple[TokenRecord, str]:
    """A new token of the tenant and its secret (shown once; only its hash is stored)."""
    row, secret = tenant_repo.create_token(s, tenant.id, name, scopes, expires_at)
    return TokenRecord.of(row), secret


def list_tokens(s: Session, tenant_id: str | None = None) -> list[TokenRecord]:
    return [TokenRecord.of(t) for t in tenant_repo.list_tokens(s, tenant_id)]


def revoke_token(s: Session, token_id: int) -> TokenRecord:
    """NotFound if there is no such token."""
    return TokenRecord.of(tenant_repo.revoke_token(s, token_id))


def authenticate(s: Session, token: str) -> Principal | str:
    """The caller a presented secret stands for, or why it is refused."""
    row = tenant_repo.token_row(s, token)
    if row is None or row.revoked_at is not None:
        return "authorization: unknown or revoked token"
    record = TokenRecord.of(row)
    if not record.active:
        assert record.expires_at is not None, "neither revoked nor active: it has expired"
        return f"authorization: token expired at {record.expires_at.isoformat()}"
    return Principal(record.tenant_id, record.id, record.name, frozenset(record.scopes), record.expires_at)


def list_audit(s: Session, tenant_id: str | None, action: str | None, after_id: int,
               limit: int) -> list[AuditEntry]:
    return [copy_row(AuditEntry, r) for r in audit_repo.list_audit(s, tenant_id, action, after_id, limit)]
