"""HTTP latency is labelled by route template (bounded), never by raw path."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient

from api.http.request_metrics import RequestMetricsMiddleware


def test_route_template_status_and_unmatched():
    seen = []
    app = FastAPI()

    @app.get("/v1/jobs/{job_id}")
    def get_job(job_id: str) -> dict:
        return {"id": job_id}

    app.add_middleware(RequestMetricsMiddleware, observe=lambda *args: seen.append(args))
    client = TestClient(app)
    for job_id in ("a", "b", "c"):
        assert client.get(f"/v1/jobs/{job_id}").status_code == 200
    assert client.get("/nowhere/123").status_code == 404
    assert [(m, r, s) for m, r, s, _ in seen] == [("GET", "/v1/jobs/{job_id}", 200)] * 3 + [("GET", "unmatched", 404)]
    assert all(seconds >= 0 for *_, seconds in seen)
