"""The FastAPI application factory: settings in, app out; the control plane lives in its lifespan."""

from __future__ import annotations

from contextlib import asynccontextmanager

import anyio.to_thread
from fastapi import FastAPI

from api.errors import install_error_handlers
from api.limits import BodyLimitMiddleware
from api.request_metrics import RequestMetricsMiddleware
from api.routers import artifacts, jobs, plans, system
from service.control import ControlPlane
from service.settings import Settings, get_settings


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        # Few threads for blocking DB work: more only queue on the GIL and stretch the latency tail.
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.api_threads
        plane = ControlPlane(settings)
        plane.start()
        app.state.plane = plane
        try:
            yield
        finally:
            plane.stop()

    app = FastAPI(title="Trainyard", version="0.1.0", lifespan=lifespan,
                  description="Cluster training service: submit JobSpecs, follow them, fetch what they produce.")
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)

    def observe(method: str, route: str, status: int, seconds: float) -> None:
        plane = getattr(app.state, "plane", None)
        if plane is not None:
            plane.live.http(method, route, status, seconds)

    app.add_middleware(RequestMetricsMiddleware, observe=observe)  # outermost: times the 413s too
    app.include_router(system.router)
    app.include_router(jobs.router)
    app.include_router(artifacts.router)
    app.include_router(plans.router)
    return app
