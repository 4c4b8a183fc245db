"""A supervisor that is alive but unreachable for a moment (ActorUnavailableError, a RayActorError)
is asked again next tick, not replaced: recovering would start a second supervisor beside it (found
by the soak); a dead one (RayActorError) is still recovered."""

from __future__ import annotations

import pytest
import ray

from service import ray_cluster
from service.cluster_port import ReplyKind
from service.db import repository as repo
from service.db import tenants as tenant_repo
from service.lifecycle import JobState
from service.live_metrics import LiveMetrics
from service.reconciler import Reconciler
from service.settings import Settings
from tests.helpers import spec_of


class _Handle:
    class drain:  # noqa: N801 - shaped like an actor method
        @staticmethod
        def remote(ack):
            return ("ref", ack)


class _Cluster:
    """The cluster port, answering every drain with one exception as Ray raises it."""

    def __init__(self, error: Exception):
        self.error = error

    def gather(self, refs, timeout_s):
        return {key: _reply_to(self.error) for key in refs}


def _reply_to(error: Exception):
    class _Ref:
        pass

    ref = _Ref()
    original = ray_cluster.ray.get

    def get(r, timeout=None):
        raise error

    ray_cluster.ray.get = get
    try:
        return ray_cluster._reply(ref)
    finally:
        ray_cluster.ray.get = original


@pytest.mark.parametrize("error, kind, recovered", [
    (ray.exceptions.ActorUnavailableError("The actor is temporarily unavailable: RpcError", None),
     ReplyKind.UNAVAILABLE, False),
    (ray.exceptions.RayActorError(), ReplyKind.GONE, True),
    (ray.exceptions.GetTimeoutError(), ReplyKind.NO_ANSWER, False),
])
def test_unavailable_is_asked_again_and_dead_is_recovered(sessions, tmp_path, monkeypatch, error, kind, recovered):
    assert _reply_to(error).kind == kind  # how Ray's exception reads at the port
    with sessions.begin() as s:
        tenant, _ = tenant_repo.create_tenant(s, "acme")
        job = repo.create_job(s, tenant.id, spec_of(**{"train.steps": 10}), 0, "sha", None, max_open_jobs=10)
        repo.transition(s, job, JobState.STARTING, "admitted")
        repo.transition(s, job, JobState.RUNNING, "running")
        job_id = job.id
    reconciler = Reconciler(sessions, Settings(home=tmp_path), launcher=object(), metrics=LiveMetrics(),
                            cluster=_Cluster(error))
    reconciler.handles[job_id] = _Handle()
    calls: list[str] = []
    monkeypatch.setattr(reconciler, "recover", calls.append)
    reconciler.tick()
    assert calls == ([job_id] if recovered else [])
    assert (job_id in reconciler.handles) is not recovered
