"""1,000 concurrent submissions spread over two replicas on one PostgreSQL and over four tenants
(scheduler paused, so accepted jobs stay QUEUED): every accepted job is stored exactly once, a
replayed Idempotency-Key returns the same job, and each tenant's max_queued_jobs quota holds
exactly although its submits race on both replicas. Latency numbers belong to bench/api_load.py."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import httpx
import pytest
from sqlalchemy import func, select

from tests.helpers import tiny_spec
from tests.live import Server, create_pg_schema, drop_pg_schema, pg_schema_url

pytestmark = pytest.mark.slow
TENANTS, PER_TENANT, QUOTA, CONNECTIONS = 4, 250, 200, 32


@pytest.fixture
def replicas(tmp_path, ray_address):
    schema = create_pg_schema()
    url = pg_schema_url(schema)
    quiet = {"TRAINYARD_SCHEDULER_ENABLED": "false", "TRAINYARD_WARM_WORKERS": "0",
             "TRAINYARD_STANDBY_SUPERVISORS": "0", "TRAINYARD_RATE_LIMIT_PER_S": "0"}  # the load is the point
    pair = [Server(tmp_path / f"home-{i}", url, ray_address, **quiet) for i in range(2)]
    try:
        for server in pair:
            server.start()
        yield url, pair
    finally:
        for server in pair:
            server.stop()
        drop_pg_schema(schema)


async def _submit_all(pair: list[Server], plan: list[tuple[str, str, int]]) -> list[httpx.Response]:
    """plan: (token, idempotency key, replica index) per submission, all in flight together."""
    body = tiny_spec()
    limits = httpx.Limits(max_connections=CONNECTIONS // 2)
    clients = [httpx.AsyncClient(base_url=s.url, limits=limits, timeout=120) for s in pair]
    try:
        async def one(token: str, key: str, replica: int) -> httpx.Response:
            return await clients[replica].post("/v1/jobs", json=body, headers={
                "Authorization": f"Bearer {token}", "Idempotency-Key": key})
        return await asyncio.gather(*(one(*p) for p in plan))
    finally:
        for c in clients:
            await c.aclose()


def test_a_thousand_concurrent_submits_over_two_replicas_store_each_job_once(replicas):
    url, pair = replicas
    tokens = {}
    with pair[0].client() as admin:
        for i in range(TENANTS):
            resp = admin.post("/v1/tenants", json={"name": f"load-{i}-{uuid.uuid4().hex[:6]}", "max_queued_jobs": QUOTA})
            assert resp.status_code == 201, resp.text
            tokens[resp.json()["id"]] = resp.json()["token"]
    plan = [(token, uuid.uuid4().hex, n % 2) for token in tokens.values() for n in range(PER_TENANT)]
    plan.sort(key=lambda p: p[1])  # tenants interleaved, each tenant's submits on both replicas
    responses = asyncio.run(_submit_all(pair, plan))

    statuses = Counter(r.status_code for r in responses)
    assert set(statuses) <= {201, 429}, [(r.status_code, r.text[:200]) for r in responses if r.status_code not in (201, 429)]
    accepted = {p[1]: r.json()["id"] for p, r in zip(plan, responses) if r.status_code == 201}
    by_tenant = Counter(tenant for p in plan for tenant, token in tokens.items() if token == p[0] and p[1] in accepted)
    assert by_tenant == {tenant: QUOTA for tenant in tokens}, by_tenant  # the quota held, no more, no fewer
    assert len(set(accepted.values())) == len(accepted) == TENANTS * QUOTA

    # Replays (on the other replica) return the job already stored, and store nothing.
    replay = [(token, key, 1 - replica) for token, key, replica in plan if key in accepted][::8]
    again = asyncio.run(_submit_all(pair, replay))
    assert all(r.status_code == 201 and r.headers["Idempotent-Replayed"] == "true" for r in again)
    assert [r.json()["id"] for r in again] == [accepted[key] for _, key, _ in replay]

    stored, keys, dup_keys = _stored(url)
    assert stored == len(accepted) and keys == set(accepted) and dup_keys == 0


def _stored(url: str) -> tuple[int, set[str], int]:
    """(job rows, their idempotency keys, keys stored more than once), read from the database."""
    from service.db.engine import make_engine, make_sessionmaker
    from service.db.models import Job

    engine = make_engine(url)
    try:
        with make_sessionmaker(engine)() as s:
            rows = s.execute(select(Job.idempotency_key, func.count()).group_by(Job.idempotency_key)).all()
    finally:
        engine.dispose()
    return sum(n for _, n in rows), {k for k, _ in rows}, sum(1 for _, n in rows if n > 1)
