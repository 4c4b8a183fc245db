"""The restart budgets are the job's, over every supervisor it had: the reconciler reads them from the
stored restart events, charges a lost supervisor to `max_infra_restarts`, and hands the counts to
the replacement (the soak saw a job RECOVERING after 7 restarts with `max_restarts: 6`)."""

from __future__ import annotations

from service.db import repository as repo
from service.db import tenants as tenant_repo
from service.lifecycle import JobState
from service.live_metrics import LiveMetrics
from service.reconciler import Reconciler
from service.restart_history import restarts_used
from service.settings import Settings
from service.supervisor.launch import Reservation
from service.supervisor.policies.failure import RestartsUsed
from tests.helpers import spec_of
from workers.events import RestartCause, RestartEvent


class RecordingLauncher:
    def __init__(self):
        self.launched: list[tuple] = []

    def reserve(self):
        return Reservation()

    def name(self, reservation, job_id, epoch):
        return f"sup-{job_id}-{epoch}"

    def launch(self, reservation, job_id, spec, epoch, total_steps, used):
        self.launched.append((job_id, epoch, used))
        return object()


def running_job(sessions, causes: list[RestartCause], **spec) -> str:
    with sessions.begin() as s:
        tenant, _ = tenant_repo.create_tenant(s, "acme")
        job = repo.create_job(s, tenant.id, spec_of(**{"train.steps": 10, **spec}), 0, "sha", None, max_open_jobs=10)
        repo.transition(s, job, JobState.STARTING, "admitted")
        repo.transition(s, job, JobState.RUNNING, "running")
        job.drained_seq = 5
        for n, cause in enumerate(causes, 1):
            event = RestartEvent(n, 0, "rank 0 failed", cause, "restart")
            repo.add_event(s, job.id, event.kind, event.message, data=event.data())
        job.restarts = len(causes)
        return job.id


def test_restarts_are_counted_by_budget_from_the_stored_events(sessions):
    job_id = running_job(sessions, [RestartCause.WORKER_LOST, RestartCause.NODE_LOST, RestartCause.HANG,
                                    RestartCause.SUPERVISOR_LOST])
    with sessions() as s:
        assert restarts_used(s, job_id) == RestartsUsed(job=2, infra=2)


def test_a_lost_supervisor_is_replaced_with_the_jobs_counts_even_past_max_restarts(sessions, tmp_path):
    job_id = running_job(sessions, [RestartCause.WORKER_LOST] * 2, **{"fault_tolerance.max_restarts": 2})
    launcher = RecordingLauncher()
    Reconciler(sessions, Settings(home=tmp_path), launcher=launcher, metrics=LiveMetrics()).recover(job_id)
    assert launcher.launched == [(job_id, 1, RestartsUsed(job=2, infra=1))]
    with sessions() as s:
        job = repo.get_job(s, job_id)
        assert job.state == JobState.RECOVERING and job.restarts == 3


def test_a_lost_supervisor_past_max_infra_restarts_fails_the_job(sessions, tmp_path):
    job_id = running_job(sessions, [RestartCause.SUPERVISOR_LOST, RestartCause.NODE_LOST],
                         **{"fault_tolerance.max_infra_restarts": 2})
    launcher = RecordingLauncher()
    Reconciler(sessions, Settings(home=tmp_path), launcher=launcher, metrics=LiveMetrics()).recover(job_id)
    assert launcher.launched == []
    with sessions() as s:
        job = repo.get_job(s, job_id)
        assert job.state == JobState.FAILED and "(max_infra_restarts 2/2)" in job.error
