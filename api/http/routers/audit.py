"""The audit log over REST (admin scope)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api.http.deps import AdminDep, SessionDep
from api.http.routers.tenants import tenant_or_404
from api.http.schemas import audit_out
from service import tenancy

router = APIRouter(prefix="/v1/audit", tags=["admin"])


@router.get("")
def audit_log(s: SessionDep, _: AdminDep,
              tenant: Annotated[str | None, Query(description="calls by this tenant or on it (id or name)")] = None,
              action: Annotated[str | None, Query(max_length=32, description="e.g. job.submit, token.revoke")] = None,
              after: Annotated[int, Query(ge=0, le=2**63 - 1, description="only records with a larger id")] = 0,
              limit: Annotated[int, Query(ge=1, le=10_000)] = 1000) -> dict:
    """State-changing calls, oldest first: who (tenant, token), what, when, target, outcome."""
    tenant_id = tenant_or_404(s, tenant).id if tenant else None
    return {"records": [audit_out(r) for r in tenancy.list_audit(s, tenant_id, action, after, limit)]}
