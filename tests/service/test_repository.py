"""The repository on SQLite and PostgreSQL: schema, tokens, jobs, idempotency, events, metrics."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy.exc import IntegrityError

from service.db import repository as repo
from service.db import tenants as tenant_repo
from service.db.engine import migrate
from service.db.models import Base
from service.db.row_counts import row_counts
from service.lifecycle import IllegalTransition, JobState
from tests.helpers import spec_of


def _job(s, tenant_id, priority=0, key=None, steps=20):
    return repo.create_job(s, tenant_id, spec_of(**{"train.steps": steps}), priority, "sha", key, max_open_jobs=100)


def test_migrations_match_the_models_and_rerun_cleanly(sessions):
    engine = sessions.engine
    migrate(engine)  # a second start-up is a no-op
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []


def test_tokens_are_stored_hashed_and_resolve_to_their_tenant(sessions):
    with sessions.begin() as s:
        tenant, token = tenant_repo.create_tenant(s, "acme")
    with sessions() as s:
        assert tenant_repo.lookup_token(s, token) == (tenant.id, False)
        assert tenant_repo.lookup_token(s, token + "x") is None
        assert token not in str(row_counts(s))
        from sqlalchemy import select

        from service.db.models import ApiToken
        stored = s.scalars(select(ApiToken.token_sha256)).all()
        assert token not in stored and tenant_repo.hash_token(token) in stored
    with sessions.begin() as s, pytest.raises(repo.IdempotencyConflict, match="already exists"):
        tenant_repo.create_tenant(s, "acme")


def test_job_is_created_queued_with_an_event_and_scoped_to_its_tenant(sessions):
    with sessions.begin() as s:
        a = tenant_repo.ensure_tenant(s, "a")
        b = tenant_repo.ensure_tenant(s, "b")
        job = _job(s, a.id)
    with sessions() as s:
        assert repo.get_job(s, job.id, a.id).state == JobState.QUEUED
        assert repo.get_job(s, job.id, b.id) is None
        assert [e.state for e in repo.list_events(s, job.id, 0, 10)] == ["QUEUED"]
        assert [j.id for j in repo.list_jobs(s, b.id, None, 10, 0)] == []


def test_idempotency_key_is_unique_per_tenant(sessions):
    with sessions.begin() as s:
        a, b = tenant_repo.ensure_tenant(s, "a"), tenant_repo.ensure_tenant(s, "b")
        _job(s, a.id, key="k1")
        _job(s, b.id, key="k1")  # another tenant may reuse a key
    with pytest.raises(IntegrityError):
        with sessions.begin() as s:
            _job(s, a.id, key="k1")
    with sessions() as s:
        assert row_counts(s)["jobs"] == 2


def test_queue_order_is_priority_then_fifo(sessions):
    with sessions.begin() as s:
        t = tenant_repo.ensure_tenant(s, "t")
        first, low, high, second = _job(s, t.id), _job(s, t.id, -5), _job(s, t.id, 10), _job(s, t.id)
    with sessions() as s:
        assert [j.id for j in repo.queued_jobs(s)] == [high.id, first.id, second.id, low.id]


def test_transitions_follow_the_table_and_are_recorded(sessions):
    with sessions.begin() as s:
        job = _job(s, tenant_repo.ensure_tenant(s, "t").id)
        repo.transition(s, job, JobState.STARTING, "admitted")
        repo.transition(s, job, JobState.RUNNING, "training")
        with pytest.raises(IllegalTransition, match="RUNNING to STARTING"):  # (-> QUEUED is a preemption)
            repo.transition(s, job, JobState.STARTING, "back")
        repo.transition(s, job, JobState.SUCCEEDED, "done")
    with sessions() as s:
        events = repo.list_events(s, job.id, 0, 10)
        assert [e.state for e in events] == ["QUEUED", "STARTING", "RUNNING", "SUCCEEDED"]
        assert events[-1].data == {"from": "RUNNING", "to": "SUCCEEDED"}
        job = repo.get_job(s, job.id)
        assert job.started_at is not None and job.finished_at is not None


def test_cancel_queued_is_immediate_running_is_flagged_terminal_is_illegal(sessions):
    with sessions.begin() as s:
        t = tenant_repo.ensure_tenant(s, "t")
        queued, running = _job(s, t.id), _job(s, t.id)
        repo.transition(s, running, JobState.STARTING, "admitted")
        repo.request_cancel(s, queued)
        repo.request_cancel(s, running)
        assert queued.state == JobState.CANCELLED
        assert running.state == JobState.STARTING and running.cancel_requested
        with pytest.raises(IllegalTransition):
            repo.request_cancel(s, queued)


def test_quota_counts_open_jobs_only(sessions):
    spec = spec_of()
    with sessions.begin() as s:
        t = tenant_repo.ensure_tenant(s, "t")
        jobs = [repo.create_job(s, t.id, spec, 0, "x", None, max_open_jobs=2) for _ in range(2)]
        with pytest.raises(repo.QuotaExceeded, match="limit"):
            repo.create_job(s, t.id, spec, 0, "x", None, max_open_jobs=2)
        repo.request_cancel(s, jobs[0])
        repo.create_job(s, t.id, spec, 0, "x", None, max_open_jobs=2)


def _step(step, loss=1.0):
    return {"step": step, "loss": loss, "step_time_s": 0.1, "samples_per_s": 10.0, "ts": 1.0}


def test_replayed_steps_replace_their_rows(sessions):
    with sessions.begin() as s:
        job = _job(s, tenant_repo.ensure_tenant(s, "t").id, steps=10)
        repo.record_steps(s, job, [_step(i, 5.0) for i in range(1, 8)], max_points=1000)
    with sessions.begin() as s:  # restarted from the checkpoint at step 5: steps 6.. come again
        job = repo.get_job(s, job.id)
        repo.record_steps(s, job, [_step(i, 4.0) for i in range(6, 11)], max_points=1000)
    with sessions() as s:
        rows = repo.list_metrics(s, job.id, 0, 100)
        assert [r.step for r in rows] == list(range(1, 11))
        assert [r.loss for r in rows[5:]] == [4.0] * 5


def test_a_step_and_its_replay_in_one_batch_leave_one_row_the_replays(sessions):
    """Steps 6-7 ran, the group crashed and resumed from step 5, and both runs' records of 6-7 reached
    the database in one batch: once a UNIQUE violation that failed every later write of the job."""
    with sessions.begin() as s:
        job = _job(s, tenant_repo.ensure_tenant(s, "t").id, steps=10)
        batch = [_step(i, 5.0) for i in range(1, 8)] + [_step(i, 4.0) for i in range(6, 11)]
        repo.record_steps(s, job, batch, max_points=1000)
    with sessions() as s:
        rows = repo.list_metrics(s, job.id, 0, 100)
        assert [r.step for r in rows] == list(range(1, 11))
        assert [r.loss for r in rows] == [5.0] * 5 + [4.0] * 5


def test_long_jobs_are_downsampled_not_truncated(sessions):
    with sessions.begin() as s:
        job = _job(s, tenant_repo.ensure_tenant(s, "t").id, steps=1000)
        repo.record_steps(s, job, [_step(i) for i in range(1, 1001)], max_points=100)
    with sessions() as s:
        steps = [r.step for r in repo.list_metrics(s, job.id, 0, 10_000)]
    assert len(steps) == 100 and steps[0] == 10 and steps[-1] == 1000
    assert repo.metric_stride(1000, 100) == 10 and repo.metric_stride(5, 100) == 1
