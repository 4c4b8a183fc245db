"""Recovery as the API shows it: every job a fault touched trains past the step it had reached."""

from __future__ import annotations

import time

import httpx

from bench.soak.ledger import TERMINAL
from bench.soak.replicas import Api


def running(api: Api, min_step: int = 1) -> dict[str, int]:
    """id -> step of every RUNNING job that has trained at least `min_step` steps."""
    jobs = api.get_json("/v1/jobs", params={"state": "RUNNING", "limit": 1000})["jobs"]
    return {j["id"]: j["step"] for j in jobs if j["step"] >= min_step}

def wait_running(api: Api, timeout_s: float, min_step: int = 3) -> dict[str, int]:
    """Wait (bounded) for a job to act on: a fault with nothing running tests nothing."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = running(api, min_step)
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)

def wait_progress(api: Api, touched: dict[str, int], timeout_s: float) -> float | None:
    """When every touched job had a step past its step at the fault (or SUCCEEDED); None at the
    deadline or if one FAILED: the fault was not recovered."""
    deadline = time.monotonic() + timeout_s
    left = dict(touched)
    while time.monotonic() < deadline:
        for job_id, step in list(left.items()):
            try:
                resp = api.request("GET", f"/v1/jobs/{job_id}")
            except RuntimeError:  # no replica answered this moment (a restart in progress)
                continue
            if resp.status_code != 200:  # a 5xx is counted by `api`; read again
                continue
            job = resp.json()
            if job["state"] == "FAILED":
                return None
            if job["step"] > step or job["state"] in TERMINAL:
                del left[job_id]
        if not left:
            return time.time()
        time.sleep(0.3)
    return None

def wait_api(api: Api, timeout_s: float) -> float | None:
    """When every live replica is ready again (after a database restart with nothing running)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        live = api.replicas.live()
        try:

            if all(httpx.get(f"{s.url}/readyz", timeout=3).status_code == 200 for s in live):
                return time.time()
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    return None
