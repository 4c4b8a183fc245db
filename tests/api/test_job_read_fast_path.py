"""GET /v1/jobs/{id}'s fast path (api/http/job_read_fast_path.py) on SQLite and PostgreSQL: it answers
only the plain success, with exactly what the ORM's job gives, and hands every other request to
the full app; over HTTP, its answers are the full route's, byte for byte."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import timedelta
from types import SimpleNamespace

import orjson
import pytest

from api.http.deps import Principal, token_cache
from api.http.job_read_fast_path import JobReadFastPath
from api.http.ratelimit import TokenBuckets
from api.http.schemas import job_out
from service.db import repository as repo
from service.db import tenants as tenant_repo
from service.db.engine import make_engine
from service.db.job_reader import JobReader
from service.db.models import utcnow
from tests.helpers import tiny_spec
from workers.spec_loading import parse_spec


class Downstream:
    """The full app's place: records what reached it."""

    def __init__(self):
        self.paths: list[str] = []

    async def __call__(self, scope, receive, send):
        self.paths.append(scope["path"])
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b"full app"})


def call(middleware, app_state, path: str, token: str | None, method: str = "GET", headers=()):
    sent: list[dict] = []
    scope = {"type": "http", "method": method, "path": path, "app": SimpleNamespace(state=app_state),
             "headers": [*([(b"authorization", f"Bearer {token}".encode())] if token else []), *headers]}

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(middleware(scope, receive, send))
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:]), scope


@pytest.fixture
def world(sessions):
    """Two tenants, a job of each, and a cached read token for the first."""
    with sessions.begin() as s:
        acme, _ = tenant_repo.create_tenant(s, f"acme-{uuid.uuid4().hex[:6]}")
        other, _ = tenant_repo.create_tenant(s, f"other-{uuid.uuid4().hex[:6]}")
        spec = parse_spec(tiny_spec())
        mine = repo.create_job(s, acme.id, spec, 3, "sha", "key-1", max_open_jobs=None).id
        theirs = repo.create_job(s, other.id, spec, 0, "sha", None, max_open_jobs=None).id
    with sessions.begin() as s:  # a job with every column filled in: timestamps, JSON, floats, booleans
        job = repo.get_job(s, mine)
        job.started_at, job.step, job.loss, job.step_time_s = utcnow(), 7, 1.25, 0.5
        job.layout, job.summary, job.cancel_requested = {"dp": 2, "stages": [[0, 1]]}, {"final_loss": 1.0}, True
    token = uuid.uuid4().hex
    token_cache.put(tenant_repo.hash_token(token), Principal(acme.id, 1, "t", frozenset({"read"})), 60)
    reader = JobReader(sessions.engine)
    state = SimpleNamespace(plane=SimpleNamespace(job_reader=reader))
    yield SimpleNamespace(sessions=sessions, mine=mine, theirs=theirs, token=token, state=state, acme=acme.id)
    token_cache.clear()
    sessions.engine.dispose()


def test_answers_a_cached_readers_own_job_as_the_orm_would(world):
    down = Downstream()
    status, body, scope = call(JobReadFastPath(down), world.state, f"/v1/jobs/{world.mine}", world.token)
    assert (status, down.paths) == (200, [])
    with world.sessions() as s:
        expected = job_out(repo.get_job(s, world.mine))  # the ORM's row: the reader must convert alike
    assert json.loads(body) == json.loads(orjson.dumps(expected))
    assert json.loads(body)["layout"] == {"dp": 2, "stages": [[0, 1]]} and json.loads(body)["cancel_requested"] is True
    assert scope["route"].path == "/v1/jobs/{job_id}"  # labelled like the full route in /metrics
    # an empty body declared on a GET is still the plain case
    assert call(JobReadFastPath(down), world.state, f"/v1/jobs/{world.mine}", world.token,
                headers=[(b"content-length", b"0")])[0] == 200


@pytest.mark.parametrize("case", ["no token", "unknown token", "basic auth", "no read scope", "expired",
                                  "other tenant", "missing job", "sub-path", "POST", "GET with a body",
                                  "rate limited", "database error"])
def test_everything_but_the_plain_success_goes_to_the_full_app(world, case, tmp_path):
    down = Downstream()
    path, token, method, headers, state = f"/v1/jobs/{world.mine}", world.token, "GET", [], world.state
    if case == "no token":
        token = None
    elif case == "unknown token":
        token = uuid.uuid4().hex
    elif case in ("no read scope", "expired"):
        token = uuid.uuid4().hex
        scopes, expires = ({"submit"}, None) if case == "no read scope" else ({"read"}, utcnow() - timedelta(seconds=1))
        token_cache.put(tenant_repo.hash_token(token), Principal(world.acme, 2, "t", frozenset(scopes), expires), 60)
    elif case == "other tenant":
        path = f"/v1/jobs/{world.theirs}"
    elif case == "missing job":
        path = "/v1/jobs/nope"
    elif case == "sub-path":
        path += "/events"
    elif case == "GET with a body":
        headers = [(b"content-length", b"5")]
    elif case == "POST":
        method = "POST"
    elif case == "rate limited":
        limiter = TokenBuckets(rate=0.001, burst=1)
        limiter.take(1)  # the token's only request
        state = SimpleNamespace(plane=world.state.plane, rate_limiter=limiter)
    elif case == "database error":
        empty = make_engine(f"sqlite:///{tmp_path}/empty.db")  # no jobs table: the read raises
        state = SimpleNamespace(plane=SimpleNamespace(job_reader=JobReader(empty)))
    if case == "basic auth":
        headers, token = [(b"authorization", b"Basic " + world.token.encode())], None
    status, body, _ = call(JobReadFastPath(down), state, path, token, method, headers)
    assert (status, body, down.paths) == (299, b"full app", [path])


def test_a_rate_limit_with_room_still_takes_the_fast_path_and_counts(world):
    limiter = TokenBuckets(rate=0.001, burst=2)
    state = SimpleNamespace(plane=world.state.plane, rate_limiter=limiter)
    down = Downstream()
    statuses = [call(JobReadFastPath(down), state, f"/v1/jobs/{world.mine}", world.token)[0] for _ in range(3)]
    assert statuses == [200, 200, 299]  # the burst of 2 is spent on the fast path too
