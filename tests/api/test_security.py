"""Abuse limits of a live service: per-token rate limit, slow clients (a stalled head is hung up
on, a stalled body gets 408, idle keep-alive connections are closed, others are served meanwhile), revocation seen by a
second replica within TRAINYARD_AUTH_CACHE_S, fault injection refused when the server forbids it."""

from __future__ import annotations

import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.api.test_bad_input import _fails
from tests.helpers import tiny_spec
from tests.live import ADMIN_TOKEN, Server

RATE, BURST, REQUEST_TIMEOUT, KEEP_ALIVE, AUTH_CACHE = 1, 5, 3.0, 1.0, 1.0
LIMITS = dict(TRAINYARD_RATE_LIMIT_PER_S=str(RATE), TRAINYARD_RATE_LIMIT_BURST=str(BURST),
              TRAINYARD_REQUEST_READ_TIMEOUT_S=str(REQUEST_TIMEOUT), TRAINYARD_KEEP_ALIVE_TIMEOUT_S=str(KEEP_ALIVE),
              TRAINYARD_AUTH_CACHE_S=str(AUTH_CACHE), TRAINYARD_ALLOW_FAULT_INJECTION="0",
              TRAINYARD_SCHEDULER_ENABLED="false", TRAINYARD_STANDBY_SUPERVISORS="0")


@pytest.fixture(scope="module")
def limited(tmp_path_factory, ray_address):
    home = tmp_path_factory.mktemp("limited")
    server = Server(home, f"sqlite:///{home}/trainyard.db", ray_address, **LIMITS).start()
    yield server
    server.stop()


def call(server: Server, method: str, path: str, token: str = ADMIN_TOKEN, **kwargs) -> httpx.Response:
    """A request that waits out the rate limit (Retry-After) instead of failing on it: for set-up calls.
    Each try on a connection of its own: the wait (1 s) reaches the server's keep-alive timeout (1 s),
    so a kept connection could be closed just as the next try is sent on it (seen under load)."""
    for _ in range(30):
        with server.client(token) as client:
            resp = client.request(method, path, **kwargs)
        if resp.status_code != 429 or "rate limit" not in resp.text:
            return resp
        time.sleep(float(resp.headers["retry-after"]))
    raise AssertionError(f"{method} {path} rate-limited for 30 tries")


def tenant_token(server: Server) -> str:
    resp = call(server, "POST", "/v1/tenants", json={"name": f"s-{uuid.uuid4().hex[:8]}"})
    assert resp.status_code == 201, resp.text
    return resp.json()["token"]


def test_rate_limit_per_token_is_429_with_retry_after(limited):
    token, other = tenant_token(limited), tenant_token(limited)
    with limited.client(token) as client, ThreadPoolExecutor(6) as pool:
        resps = list(pool.map(lambda _: client.get("/v1/jobs"), range(4 * BURST)))
    statuses = [r.status_code for r in resps]
    assert set(statuses) == {200, 429} and statuses.count(200) >= BURST, statuses
    limited_resp = next(r for r in resps if r.status_code == 429)
    _fails(limited_resp, 429, "rate limit", f"{RATE:g} requests per second", f"bursts of {BURST}")
    retry_after = int(limited_resp.headers["retry-after"])
    assert retry_after >= 1
    with limited.client(other) as client:  # another token has its own bucket
        assert client.get("/v1/jobs").status_code == 200
    time.sleep(retry_after + 0.5)
    with limited.client(token) as client:
        assert client.get("/v1/jobs").status_code == 200


def test_stalled_body_gets_408_within_the_bound_and_others_are_served(limited):
    token = tenant_token(limited)
    head = (f"POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
            "Content-Type: application/json\r\nContent-Length: 500\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", limited.port)) as slow:
        slow.sendall(head + b'{"name": "slow')  # ...and nothing more
        started = time.monotonic()
        assert httpx.get(f"{limited.url}/healthz", timeout=10).status_code == 200  # served meanwhile
        slow.settimeout(60)
        answer = b""
        while chunk := slow.recv(65536):  # until the server hangs up
            answer += chunk
        waited = time.monotonic() - started
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert b"not received within 3 s" in answer
    assert REQUEST_TIMEOUT * 0.75 <= waited < REQUEST_TIMEOUT + 30, waited
    assert call(limited, "GET", "/v1/jobs", token).json()["jobs"] == []  # nothing was stored


def test_stalled_request_head_is_hung_up_on_within_the_bound(limited):
    with socket.create_connection(("127.0.0.1", limited.port)) as slow:
        slow.sendall(b"GET /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthoriza")  # ...and nothing more
        started = time.monotonic()
        time.sleep(KEEP_ALIVE * 1.5)
        slow.sendall(b"tion: Bearer x")  # a trickle does not restart the bound
        assert httpx.get(f"{limited.url}/healthz", timeout=10).status_code == 200  # served meanwhile
        slow.settimeout(60)
        assert slow.recv(65536) == b""  # closed by the server without an answer
        waited = time.monotonic() - started
    assert REQUEST_TIMEOUT * 0.75 <= waited < REQUEST_TIMEOUT + 30, waited


def test_idle_keep_alive_connection_is_closed(limited):
    with socket.create_connection(("127.0.0.1", limited.port)) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        conn.settimeout(60)
        answer = b""
        while b'{"status":"ok"}' not in answer:
            answer += conn.recv(65536)
        idle_since = time.monotonic()
        assert conn.recv(65536) == b""  # closed by the server, not by us
        idle = time.monotonic() - idle_since
    assert answer.startswith(b"HTTP/1.1 200")
    assert KEEP_ALIVE * 0.5 <= idle < KEEP_ALIVE + 30, idle


def test_fault_injection_refused_when_the_server_forbids_it_even_for_admins(limited):
    faulty = tiny_spec(fault_injection=[{"at_step": 3, "kind": "crash"}])
    _fails(call(limited, "POST", "/v1/jobs", json=faulty), 422, "fault_injection is refused", "does not allow it")


def test_revocation_reaches_another_replica_within_the_cache_time(limited, tmp_path, ray_address):
    replica = Server(tmp_path / "replica", f"sqlite:///{limited.home}/trainyard.db", ray_address,
                     TRAINYARD_CONTROL_LOOPS="false", **LIMITS).start()
    try:
        row = call(limited, "POST", "/v1/tokens",
                   json={"tenant": "admin", "name": "short-lived", "scopes": ["read"]}).json()
        assert call(replica, "GET", "/v1/jobs", row["token"]).status_code == 200  # cached on the replica now
        assert call(limited, "DELETE", f"/v1/tokens/{row['id']}").status_code == 200
        revoked_at = time.monotonic()
        _fails(call(limited, "GET", "/v1/jobs", row["token"]), 401, "revoked")  # at once where it was revoked
        while call(replica, "GET", "/v1/jobs", row["token"]).status_code == 200:
            assert time.monotonic() - revoked_at < AUTH_CACHE + 20, "the replica still accepts a revoked token"
            time.sleep(0.1)
        _fails(call(replica, "GET", "/v1/jobs", row["token"]), 401, "revoked")
    finally:
        replica.stop()
