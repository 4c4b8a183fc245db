"""HTTP request latency by route template, as plain ASGI middleware (no per-request task overhead).

The route label is the matched path template (`/v1/jobs/{job_id}`), never the raw path, so the
label set stays bounded; requests that match no route count as `unmatched`.
"""

from __future__ import annotations

import time


class RequestMetricsMiddleware:
    def __init__(self, app, observe):
        self.app, self.observe = app, observe  # observe(method, route, status, seconds)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = 500

        async def tracking_send(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            try:
                self.observe(scope["method"], route, status, time.perf_counter() - started)
            except Exception:  # metrics never fail a request
                pass
