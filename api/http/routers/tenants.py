"""Tenant administration (admin scope): create with quotas and fair-share fields, list, read, change them."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Body, Request
from pydantic import BaseModel, ConfigDict, Field

from api.http.deps import AdminDep, PlaneDep, SessionDep
from api.http.errors import ApiError
from api.http.schemas import tenant_out
from service import tenancy
from service.records import TenantRecord

router = APIRouter(prefix="/v1/tenants", tags=["admin"])


class Quotas(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_workers: int | None = Field(None, ge=1, le=100_000,
                                    description="workers its jobs may hold at once; null = no limit")
    max_queued_jobs: int | None = Field(None, ge=0, le=1_000_000,
                                        description="jobs it may have QUEUED; null = no limit")
    quota_mode: Literal["reject", "queue"] = Field(
        "reject", description="over max_workers at submit: reject = 429, queue = accept and wait for room")
    allow_user_code: bool = Field(False, description="may submit model.entrypoint / data.entrypoint specs")
    # strict: a string or a boolean is not a weight (JSON integers still are)
    weight: float = Field(1.0, gt=0, le=1_000_000, allow_inf_nan=False, strict=True,
                          description="fair share: a tenant of weight 2 gets twice the share of one of weight 1 "
                                      "before its jobs yield to others'")
    reserve_after_s: float | None = Field(
        None, ge=0, le=365 * 86400, allow_inf_nan=False, strict=True,
        description="a queued job of this tenant that does not fit waits this long while smaller jobs start "
                    "past it, then capacity is held for it; null = the server's TRAINYARD_RESERVE_AFTER_S")


class TenantIn(Quotas):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$", description="lower-case tenant name")


class TenantPatch(Quotas):
    """Only the fields sent change; send null to lift a limit."""


def tenant_or_404(s, id_or_name: str) -> TenantRecord:
    tenant = tenancy.find_tenant(s, id_or_name)
    if tenant is None:
        raise tenant_not_found(id_or_name)
    return tenant


def tenant_not_found(id_or_name: str) -> ApiError:
    return ApiError(404, f"tenant {id_or_name!r} not found")


@router.post("", status_code=201)
def create_tenant(body: Annotated[TenantIn, Body()], request: Request, plane: PlaneDep, _: AdminDep) -> dict:
    """A new tenant, its quotas, and its first token (scopes read and submit; shown once, stored hashed)."""
    with plane.sessions.begin() as s:
        tenant, token = tenancy.create_tenant(s, body.name, **body.model_dump(exclude={"name"}))
        request.state.audit_target = request.state.audit_target_tenant = tenant.id
        return {**tenant_out(tenant), "token": token}


@router.get("")
def list_tenants(s: SessionDep, _: AdminDep) -> dict:
    return {"tenants": [tenant_out(t) for t in tenancy.list_tenants(s)]}


@router.get("/{tenant_id}")
def get_tenant(tenant_id: str, s: SessionDep, _: AdminDep) -> dict:
    """A tenant (by id or name) with what it uses now against its quotas."""
    tenant = tenant_or_404(s, tenant_id)
    usage = tenancy.tenant_usage(s, tenant.id)
    return {**tenant_out(tenant), "usage": {"queued_jobs": usage.queued, "running_workers": usage.active_workers,
                                            "queued_workers": usage.queued_workers}}


@router.patch("/{tenant_id}")
def update_tenant(tenant_id: str, body: Annotated[TenantPatch, Body()], request: Request, plane: PlaneDep,
                  _: AdminDep) -> dict:
    """Change quotas, allow_user_code, weight or reserve_after_s (by id or name). Jobs already accepted
    stay; the scheduler applies a new max_workers, weight or reserve_after_s from its next tick."""
    with plane.sessions.begin() as s:
        tenant = tenancy.update_tenant(s, tenant_id, body.model_dump(exclude_unset=True))
        if tenant is None:
            raise tenant_not_found(tenant_id)
        request.state.audit_target = request.state.audit_target_tenant = tenant.id
        return tenant_out(tenant)
