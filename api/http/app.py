"""The FastAPI application factory: settings in, app out; the control plane lives in its lifespan."""

from __future__ import annotations

from contextlib import asynccontextmanager

import anyio.to_thread
from fastapi import Depends, FastAPI

from api.http.audit import AuditMiddleware
from api.http.database_outage import DatabaseOutageMiddleware
from api.http.deps import require, require_by_method
from api.http.errors import install_error_handlers
from api.http.job_read_fast_path import JobReadFastPath
from api.http.json_depth import JsonDepthMiddleware
from api.http.limits import BodyLimit, BodyLimitMiddleware
from api.http.ratelimit import TokenBuckets
from api.http.request_metrics import RequestMetricsMiddleware
from api.http.routers import artifacts, audit, code, console, jobs, plans, queue, system, tenants, tokens
from api.http.server_errors import UnexpectedErrorMiddleware
from service.cluster_port import Cluster
from service.control import ControlPlane
from service.settings import Settings, get_settings
from service.shared_state import SharedState


def create_app(settings: Settings | None = None, shared: SharedState | None = None, api_only: bool = False,
               on_started=None, cluster: Cluster | None = None) -> FastAPI:
    """shared/api_only: one process of `trainyard serve --workers N` (api/cli/processes.py);
    on_started(plane) runs once the control plane is up (the primary starts its API workers then);
    cluster: what the control plane runs jobs on (None: Ray; the fleet simulator passes its own)."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # Few threads for blocking DB work: more only queue on the GIL and stretch the latency tail.
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.api_threads
        plane = ControlPlane(settings, shared, api_only, cluster)
        plane.start()
        app.state.plane = plane
        stop_extra = on_started(plane) if on_started else None
        try:
            yield
        finally:
            if stop_extra:
                stop_extra()
            plane.stop()

    app = FastAPI(title="Trainyard", version="0.1.0", lifespan=lifespan,
                  description="Cluster training service: submit JobSpecs, follow them, fetch what they produce.")
    install_error_handlers(app)
    if settings.rate_limit_per_s > 0:
        app.state.rate_limiter = TokenBuckets(settings.rate_limit_per_s, settings.rate_limit_burst)
    app.add_middleware(AuditMiddleware)
    # Inside the body limits, which bound what it reads; a code upload is a zip, not JSON.
    app.add_middleware(JsonDepthMiddleware, skip=frozenset({code.PATH}))
    # A code upload is a file, not a JSON spec: its own (larger) limit, checked instead of the default one.
    code_limit = BodyLimit(settings.max_code_bytes, settings.request_read_timeout_s, "TRAINYARD_MAX_CODE_BYTES",
                           min_bytes_per_s=code.MIN_UPLOAD_BYTES_PER_S)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes,
                       read_timeout_s=settings.request_read_timeout_s, routes={code.PATH: code_limit})
    app.add_middleware(JobReadFastPath)  # GET /v1/jobs/{id}'s plain success, without the framework
    # A read waits out a database restart; a longer outage, or a write during one, is a 503, not a 500.
    app.add_middleware(DatabaseOutageMiddleware, wait_s=settings.db_unavailable_wait_s)

    def observe(method: str, route: str, status: int, seconds: float) -> None:
        plane = getattr(app.state, "plane", None)
        if plane is not None:
            plane.observe_http(method, route, status, seconds)

    app.add_middleware(RequestMetricsMiddleware, observe=observe)  # times the 413s too
    app.add_middleware(UnexpectedErrorMiddleware)  # outermost: a fault is a 500 that keeps the connection
    # Every /v1 route's scope, in one place: job reads need read, submit, cancel and code uploads need submit,
    # administration needs admin (tests/api/test_tenancy.py::test_every_route_checks_its_scope
    # checks every route).
    app.include_router(system.router)
    app.include_router(console.router)  # the web console's shell and files; its data comes from /v1
    app.include_router(jobs.router, dependencies=[Depends(require_by_method)])
    app.include_router(code.router, dependencies=[Depends(require("submit"))])
    app.include_router(artifacts.router, dependencies=[Depends(require("read"))])
    app.include_router(plans.router, dependencies=[Depends(require("read"))])
    app.include_router(queue.router, dependencies=[Depends(require("read"))])
    for admin_router in (tenants.router, tokens.router, audit.router):
        app.include_router(admin_router, dependencies=[Depends(require("admin"))])
    return app
