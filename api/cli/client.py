"""A small HTTP client for the CLI and the demo: TRAINYARD_URL plus the stored token."""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO

import httpx

DEFAULT_URL = "http://127.0.0.1:8600"


class ApiFailure(Exception):
    def __init__(self, status: int, message: str, errors: list[dict] | None = None):
        super().__init__(message)
        self.status, self.message, self.errors = status, message, errors or []


def service_url() -> str:
    return os.environ.get("TRAINYARD_URL", DEFAULT_URL).rstrip("/")


def stored_token() -> str | None:
    """TRAINYARD_TOKEN, else TRAINYARD_ADMIN_TOKEN, else the admin token an embedded service wrote."""
    from service.settings import get_settings

    for var in ("TRAINYARD_TOKEN", "TRAINYARD_ADMIN_TOKEN"):
        if os.environ.get(var):
            return os.environ[var]
    path: Path = get_settings().admin_token_file
    return path.read_text().strip() if path.exists() else None


class Client:
    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 30.0):
        self.url = url or service_url()
        token = token or stored_token()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, **kwargs) -> httpx.Response:
        try:
            resp = self.http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ApiFailure(0, f"cannot reach the service at {self.url} ({exc}); "
                                "start it with 'trainyard serve' or set TRAINYARD_URL") from exc
        if resp.status_code >= 400:
            try:
                body = resp.json()
                raise ApiFailure(resp.status_code, body.get("detail", resp.text), body.get("errors"))
            except ValueError:
                raise ApiFailure(resp.status_code, resp.text) from None
        return resp

    def submit(self, spec: dict, priority: int = 0, idempotency_key: str | None = None) -> dict:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        return self.request("POST", "/v1/jobs", json=spec, params={"priority": priority}, headers=headers).json()

    def upload_code(self, zipped: IO[bytes]) -> dict:
        """POST /v1/code: a working_dir's zip, streamed from an open file; {ref, sha256, bytes, created}."""
        return self.request("POST", "/v1/code", content=zipped, headers={"Content-Type": "application/zip"}).json()

    def job(self, job_id: str) -> dict:
        return self.request("GET", f"/v1/jobs/{job_id}").json()

    def jobs(self, state: str | None = None, limit: int = 100) -> list[dict]:
        params = {"limit": limit, **({"state": state} if state else {})}
        return self.request("GET", "/v1/jobs", params=params).json()["jobs"]

    def cancel(self, job_id: str) -> dict:
        return self.request("POST", f"/v1/jobs/{job_id}/cancel").json()

    def events(self, job_id: str, after: int = 0) -> list[dict]:
        return self.request("GET", f"/v1/jobs/{job_id}/events", params={"after": after}).json()["events"]

    def metrics(self, job_id: str) -> dict:
        return self.request("GET", f"/v1/jobs/{job_id}/metrics").json()

    def logs(self, job_id: str, rank: str = "0", tail: int = 200) -> str:
        return self.request("GET", f"/v1/jobs/{job_id}/logs", params={"rank": rank, "tail": tail}).text

    def follow_logs(self, job_id: str, rank: str = "0", tail: int = 200):
        params = {"rank": rank, "tail": tail, "follow": "true"}
        try:
            with self.http.stream("GET", f"/v1/jobs/{job_id}/logs", params=params, timeout=None) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    body = resp.json()
                    raise ApiFailure(resp.status_code, body.get("detail", ""), body.get("errors"))
                yield from resp.iter_text()
        except httpx.TransportError as exc:
            raise ApiFailure(0, f"lost the service at {self.url} ({exc})") from exc
