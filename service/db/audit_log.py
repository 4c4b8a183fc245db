"""The audit log: recording an action taken through the API and reading the log back, oldest
first. Like service/db/repository.py, each function takes a Session and leaves committing to the caller.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.db.models import AuditRecord


def add_audit(s: Session, **fields) -> None:
    s.add(AuditRecord(**fields))


def list_audit(s: Session, tenant_id: str | None, action: str | None, after_id: int, limit: int) -> list[AuditRecord]:
    """Oldest first; a tenant filter matches the caller's tenant or the tenant acted upon."""
    q = select(AuditRecord).where(AuditRecord.id > after_id)
    if tenant_id is not None:
        q = q.where((AuditRecord.tenant_id == tenant_id) | (AuditRecord.target_tenant_id == tenant_id))
    if action is not None:
        q = q.where(AuditRecord.action == action)
    return list(s.scalars(q.order_by(AuditRecord.id).limit(limit)))
