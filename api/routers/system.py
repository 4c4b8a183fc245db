"""Health, readiness, Prometheus metrics and tenant administration."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import text

from api.deps import AdminDep, PlaneDep
from service.db import repository as repo
from service.metrics import render

router = APIRouter(tags=["system"])


@router.get("/healthz")
def healthz() -> dict:
    """The process is up (it may not be ready to run jobs yet)."""
    return {"status": "ok"}


@router.get("/readyz")
def readyz(plane: PlaneDep) -> JSONResponse:
    """Ready: the database answers and Ray is connected."""
    checks = {"database": "ok", "ray": "ok" if plane.ray_ready.is_set() else (plane.ray_error or "connecting")}
    try:
        with plane.sessions() as s:
            s.execute(text("SELECT 1"))
    except Exception as exc:
        checks["database"] = f"{type(exc).__name__}"
    ready = all(v == "ok" for v in checks.values())
    return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)


@router.get("/metrics", response_class=Response)
def prometheus(plane: PlaneDep) -> Response:
    return Response(render(plane.registry), media_type=CONTENT_TYPE_LATEST)


class TenantIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,62}$", description="lower-case tenant name")


@router.post("/v1/tenants", status_code=201, tags=["admin"])
def create_tenant(body: Annotated[TenantIn, Body()], plane: PlaneDep, _: AdminDep) -> dict:
    """A new tenant and its first token (shown once; stored hashed). Admin only."""
    with plane.sessions.begin() as s:
        tenant, token = repo.create_tenant(s, body.name)
        return {"id": tenant.id, "name": tenant.name, "token": token}
