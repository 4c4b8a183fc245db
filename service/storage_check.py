"""`trainyard serve` proves at start-up that it can use TRAINYARD_STORAGE_URI: it writes a small object,
reads it back and deletes it. A store the service cannot write to would otherwise accept jobs whose
logs, code and models then go nowhere; the cause is said in the user's words (no credentials, no such
bucket, unreachable endpoint, access denied), not as a client library's traceback."""

from __future__ import annotations

import os
import threading
import uuid

from workers.storage import Storage

PROBE_TIMEOUT_S = 30.0  # an endpoint that never answers (a dropped route) is reported, not waited for


def storage_problem(storage: Storage, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """Why the service cannot write to `storage`, or None when it can."""
    outcome: list[str | None] = []
    probe = threading.Thread(target=lambda: outcome.append(_probe(storage)), daemon=True)
    probe.start()
    probe.join(timeout_s)
    if not outcome:
        return f"cannot write to {storage.uri}: unreachable endpoint (no answer in {timeout_s:.0f} s{_endpoint()})"
    return outcome[0]


def _probe(storage: Storage) -> str | None:
    name, data = f".trainyard-probe-{uuid.uuid4().hex}", b"trainyard storage probe"
    try:
        storage.write_bytes(name, data)
        back = storage.read_bytes(name)
        storage.remove(name)
    except Exception as exc:  # any failure is the answer; the service does not start
        return f"cannot write to {storage.uri}: {_cause(exc)}"
    return None if back == data else f"cannot write to {storage.uri}: read back other bytes than it wrote"


def _cause(exc: BaseException) -> str:
    kind, text = type(exc).__name__, str(exc)
    if kind in ("NoCredentialsError", "PartialCredentialsError", "DefaultCredentialsError"):
        return f"no credentials ({text}; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or give the pods a role)"
    if isinstance(exc, FileNotFoundError) and "bucket" in text.lower():
        return "no such bucket"
    if kind in ("EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError") or \
            isinstance(exc, ConnectionError):
        return f"unreachable endpoint ({text})"
    if isinstance(exc, PermissionError):
        return f"access denied ({text})"
    return f"{kind}: {text}"


def _endpoint() -> str:
    endpoint = os.environ.get("AWS_ENDPOINT_URL")
    return f"; AWS_ENDPOINT_URL={endpoint}" if endpoint else ""
