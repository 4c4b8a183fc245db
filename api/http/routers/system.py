"""Health, readiness and Prometheus metrics (no token needed)."""

from __future__ import annotations

import httpx
from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text

from api.http.deps import PlaneDep
from service.metrics import render

router = APIRouter(tags=["system"])
# The primary renders /metrics in milliseconds; past this a worker answers 503 at once, well
# inside Prometheus' 10 s scrape timeout, and frees its thread.
PRIMARY_METRICS_TIMEOUT_S = 3.0


@router.get("/healthz")
def healthz() -> dict:
    """The process is up (it may not be ready to run jobs yet)."""
    return {"status": "ok"}


@router.get("/readyz")
def readyz(plane: PlaneDep) -> JSONResponse:
    """Ready: the database answers, Ray is connected, every API process serves and, with
    TRAINYARD_SUPERVISOR_RESOURCE set, some Ray node offers that resource (else jobs wait unplaced)."""
    checks = {"database": "ok", "ray": "ok" if plane.ray_ready.is_set() else (plane.ray_error or "connecting")}
    if plane.shared is not None:
        checks["api_workers"] = plane.shared.workers_check()
    if plane.settings.supervisor_resource:  # placed by a resource of their own: some node must offer it
        checks["supervisors"] = plane.supervisor_placement or "ok"
    try:
        with plane.sessions() as s:
            s.execute(text("SELECT 1"))
    except Exception as exc:
        checks["database"] = f"{type(exc).__name__}"
    ready = all(v == "ok" for v in checks.values())
    return JSONResponse({"ready": ready, "checks": checks}, status_code=200 if ready else 503)


@router.get("/metrics", response_class=Response)
def prometheus(plane: PlaneDep) -> Response:
    if plane.api_only:  # an API worker: the primary holds the live series (and counts ours)
        try:
            upstream = httpx.get(f"{plane.shared.primary_url}/metrics", timeout=PRIMARY_METRICS_TIMEOUT_S)
        except httpx.TransportError as exc:
            return Response(f"the primary process did not answer: {type(exc).__name__}\n", status_code=503)
        return Response(upstream.content, status_code=upstream.status_code, media_type=CONTENT_TYPE_LATEST)
    return Response(render(plane.registry), media_type=CONTENT_TYPE_LATEST)
