"""Fuzz every operation of the service's own OpenAPI document with schemathesis, against a live
`trainyard serve` on PostgreSQL (scheduler paused: fuzzed jobs stay QUEUED), with the admin token
and without one. Checks: never a 5xx, and status codes, content types, headers and bodies as the
document declares them. Bounded: a few examples per operation, the whole module well under 90 s."""

from __future__ import annotations

import io
import os
import zipfile

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.live import (
    ADMIN_TOKEN,
    Server,
    create_pg_schema,
    drop_pg_schema,
    pg_schema_url,
)

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]
FUZZ = settings(deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck),
                phases=[Phase.explicit, Phase.generate])  # no shrinking: report what failed, fast



def _zipped(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return buf.getvalue()


# POST /v1/code takes a zip: real zips (names may be unsafe: '..', absolute) and arbitrary bytes.
ZIPS = st.one_of(st.binary(max_size=512), st.dictionaries(st.text(min_size=1, max_size=12), st.binary(max_size=64),
                                                          max_size=4).map(_zipped))
schemathesis.openapi.media_type("application/zip", ZIPS)


@pytest.fixture(scope="module")
def live(tmp_path_factory, ray_address):
    schema = create_pg_schema()
    home = tmp_path_factory.mktemp("fuzz")
    server = Server(home, pg_schema_url(schema), ray_address, TRAINYARD_SCHEDULER_ENABLED="false",
                    TRAINYARD_WARM_WORKERS="0", TRAINYARD_STANDBY_SUPERVISORS="0", TRAINYARD_RATE_LIMIT_PER_S="0",
                    TRAINYARD_MAX_BODY_BYTES="100000").start()
    yield server
    server.stop()
    drop_pg_schema(schema)


def _fuzz(server: Server, headers: dict, max_examples: int) -> list[str]:
    """Every operation, positive and negative (schema-violating) inputs; the failures, described."""
    api = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    failures: list[str] = []
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) >= 15, [f"{op.method} {op.path}" for op in operations]
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(FUZZ, max_examples=max_examples)
            def run(case):
                response = case.call(base_url=server.url, headers=headers, timeout=30)
                try:
                    case.validate_response(response, checks=CHECKS)
                except (AssertionError, BaseExceptionGroup) as exc:  # schemathesis groups failed checks
                    failures.append(f"{case.method} {case.formatted_path} ({mode.value}) -> "
                                    f"{response.status_code} {response.text[:300]}\n    {str(exc)[:600]}")

            try:
                run()
            except Unsatisfiable:  # nothing in this operation can be made invalid (no parameters, no body)
                assert mode == GenerationMode.NEGATIVE, f"{operation.method} {operation.path}"
    return failures


EXAMPLES = int(os.environ.get("TRAINYARD_FUZZ_EXAMPLES", "10"))  # per operation and mode; more for a deeper run


def test_fuzz_with_the_admin_token(live):
    failures = _fuzz(live, {"Authorization": f"Bearer {ADMIN_TOKEN}"}, max_examples=EXAMPLES)
    assert not failures, "\n".join(failures[:15])


def test_fuzz_without_a_token(live):
    failures = _fuzz(live, {}, max_examples=max(1, EXAMPLES // 3))
    assert not failures, "\n".join(failures[:15])


def test_a_nul_character_the_database_refuses_is_a_422_not_a_500(live):
    """Found by the fuzzer: PostgreSQL refuses NUL in text, which surfaced as a 500."""
    with live.client() as admin:
        before = admin.get("/v1/tokens").json()
        resp = admin.post("/v1/tokens", json={"name": "x", "tenant": "a\u0000b", "scopes": ["read"]})
        assert resp.status_code == 422, resp.text
        assert "NUL" in resp.json()["detail"]
        assert admin.get("/v1/tokens").json() == before  # nothing written
