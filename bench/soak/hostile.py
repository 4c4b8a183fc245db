"""A burst of hostile requests: schemathesis over the service's own OpenAPI document, and hand-written
cases (deep nesting, huge headers and bodies, path escapes, another tenant's ids). Never a 5xx, never
another tenant's job or a file outside the service, and a keep-alive connection survives a bad body."""

from __future__ import annotations

import random
import uuid
import warnings

import httpx

from bench.soak.replicas import Api

PASSWD = "root:x:0:0"  # what a path escape to /etc/passwd would show
ESCAPES = ["/v1/jobs/..%2F..%2F..%2Fetc%2Fpasswd", "/v1/jobs/%2e%2e/%2e%2e/etc/passwd", "/v1/jobs/../../etc/passwd",
           "/v1/jobs/{id}/logs?rank=../../../../etc/passwd", "/v1/jobs/{id}/logs?rank=-1",
           "/v1/jobs/{id}/checkpoints/..%2F..%2F..%2Fetc%2Fpasswd", "/v1/code/..%2F..%2Fetc%2Fpasswd",
           "/v1/jobs/%00", "/v1/jobs/" + "a" * 5000]


def hostile_tenant(api: Api) -> str:
    """A token of a tenant that may submit nothing (no queue room): fuzzed submits can never train."""
    name = f"hostile-{uuid.uuid4().hex[:8]}"
    r = api.request("POST", "/v1/tenants", json={"name": name, "max_workers": 1, "max_queued_jobs": 0})
    r.raise_for_status()
    r = api.request("POST", "/v1/tokens", json={"tenant": name, "name": "soak", "scopes": ["read", "submit"]})
    r.raise_for_status()
    return r.json()["token"]


def hand_written(api: Api, token: str, victim: str) -> list[str]:
    """Every violation found (a 5xx is also counted by `api`)."""
    bad: list[str] = []
    url = api.replicas.live()[0].url
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as conn:
        for depth in (5_000, 100_000):  # deep nesting, then a keep-alive request on the same connection
            r = conn.post("/v1/jobs", content=b'{"a":' * depth + b"1" + b"}" * depth,
                          headers={"Content-Type": "application/json"})
            api.note("POST", "/v1/jobs (nested)", r)
            if r.status_code not in (413, 422):
                bad.append(f"nested {depth}: {r.status_code}")
            if conn.get("/healthz").status_code != 200:
                bad.append(f"keep-alive connection unusable after a body nested {depth} deep")
        try:
            r = conn.get("/v1/jobs", headers={"X-Huge": "x" * 200_000})
            api.note("GET", "/v1/jobs (huge header)", r)
            if r.status_code < 400:
                bad.append(f"200 KB header accepted: {r.status_code}")
        except httpx.TransportError:
            pass  # the server closed the connection: acceptable for a header over its limit
    r = api.request("POST", "/v1/jobs", token=token, content=b"x" * (20 << 20),
                    headers={"Content-Type": "application/json"})
    if r.status_code != 413:
        bad.append(f"20 MB body: {r.status_code}")
    for path in ESCAPES:
        r = api.request("GET", path.replace("{id}", victim), token=token)
        if PASSWD in r.text or r.status_code < 400:
            bad.append(f"{path}: {r.status_code} {r.text[:100]}")
    for method, path in (("GET", "/v1/jobs/{id}"), ("GET", "/v1/jobs/{id}/events"), ("GET", "/v1/jobs/{id}/logs"),
                         ("GET", "/v1/jobs/{id}/metrics"), ("GET", "/v1/jobs/{id}/checkpoints"),
                         ("POST", "/v1/jobs/{id}/cancel")):
        r = api.request(method, path.replace("{id}", victim), token=token)
        if r.status_code != 404:  # another tenant's job is as if it did not exist
            bad.append(f"another tenant's {method} {path}: {r.status_code}")
    listed = api.get_json("/v1/jobs", token=token, params={"limit": 1000})["jobs"]
    if any(j["id"] == victim for j in listed):
        bad.append("another tenant's job listed")
    return bad


def fuzz(api: Api, token: str, seed: int, examples: int) -> list[str]:
    """schemathesis over /openapi.json with the hostile tenant's token and without one: 5xx only."""
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode

    schemathesis.openapi.media_type("application/zip", st.binary(max_size=512))  # POST /v1/code's body
    schema = schemathesis.openapi.from_url(f"{api.replicas.live()[0].url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    bad: list[str] = []
    rng = random.Random(seed)
    for operation in rng.sample(operations, k=min(len(operations), 8)):
        for headers in ({"Authorization": f"Bearer {token}"}, {}):
            mode = rng.choice((GenerationMode.POSITIVE, GenerationMode.NEGATIVE))

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(deadline=None, database=None, max_examples=examples, suppress_health_check=list(HealthCheck),
                      phases=[Phase.explicit, Phase.generate])
            def call(case):
                target = api.replicas.live()[0]
                try:
                    r = case.call(base_url=target.url, headers=headers, timeout=30)
                except Exception:  # a request the client cannot send (a header it refuses), or a replica gone
                    return
                api.note(case.method, f"{operation.path} (fuzz)", r)

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    call()
                except Unsatisfiable:
                    pass  # nothing in this operation can be made invalid
    return bad
