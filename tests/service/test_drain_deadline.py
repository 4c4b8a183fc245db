"""A reconcile pass waits for its supervisors under one short deadline (half the loop's interval): a
supervisor not back by then holds no pass, is not asked again while its drain is in flight, and its
answer is stored by a later pass, so nothing is lost; a replaced supervisor gets a fresh drain."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from bench.control_pass import FakeCluster, running_jobs
from service.cluster_port import Reply, ReplyKind
from service.db.models import Job
from service.live_metrics import LiveMetrics
from service.reconciler import Reconciler
from service.settings import Settings
from service.unanswered_drains import UnansweredDrains


class LateCluster(FakeCluster):
    """Answers a slow job's drain only at its `answer_on`-th gather, as a loaded actor answers late."""

    def __init__(self, answer_on: int):
        super().__init__()
        self.slow: str | None = None
        self.answer_on = answer_on
        self.seen: list[tuple[int, object]] = []  # (gather number, the slow job's ref in it)
        self.deadlines: list[float] = []
        self.gathers = 0

    def gather(self, refs: dict, timeout_s: float) -> dict:
        self.gathers += 1
        self.deadlines.append(timeout_s)
        held = {}
        if self.slow in refs:
            self.seen.append((self.gathers, refs[self.slow]))
            if len(self.seen) < self.answer_on:
                held[self.slow] = Reply(ReplyKind.NO_ANSWER, error="no answer yet")
        return {**super().gather({k: r for k, r in refs.items() if k not in held}, timeout_s), **held}


def _stored_step(sessions, job_id: str) -> int:
    with sessions() as s:
        return s.scalar(select(Job.step).where(Job.id == job_id)) or 0


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_late_supervisor_is_gathered_again_not_asked_twice(sessions, tmp_path):
    cluster = LateCluster(answer_on=3)
    ids = running_jobs(sessions, cluster, 3)
    cluster.slow = ids[0]
    reconciler = Reconciler(sessions, Settings(home=tmp_path, loop_interval_s=0.4), launcher=object(),
                            metrics=LiveMetrics(), cluster=cluster)
    sups = {s.job_id: s for s in cluster.supervisors.values()}
    for sup in sups.values():
        sup.train_step()
    reconciler.tick()
    reconciler.tick()
    assert cluster.deadlines == [0.2, 0.2]  # half the loop's interval, once per pass
    assert _stored_step(sessions, ids[0]) == 0 and _stored_step(sessions, ids[1]) == 1  # the others went on
    reconciler.tick()  # the slow one answers its first drain now
    assert [n for n, _ in cluster.seen] == [1, 2, 3]
    assert len({id(ref) for _, ref in cluster.seen}) == 1  # one drain in flight, never a second
    assert _stored_step(sessions, ids[0]) == 1  # stored: nothing lost
    assert not len(reconciler.waiting)
    sups[ids[0]].train_step()
    reconciler.tick()
    assert cluster.seen[-1][1] is not cluster.seen[0][1]  # answered: the next pass sends a new drain


def test_a_new_supervisor_gets_a_fresh_drain_and_ended_jobs_are_forgotten():
    waiting = UnansweredDrains()
    old, new, ref = object(), object(), object()
    waiting.update({"a": Reply(ReplyKind.NO_ANSWER), "b": Reply(ReplyKind.NO_ANSWER)}, {"a": ref, "b": ref},
                   {"a": old, "b": old})
    assert waiting.ref("a", old) is ref
    assert waiting.ref("a", new) is None  # replaced supervisor: its predecessor's answer no longer counts
    waiting.update({}, {}, {})  # "b" was not asked this pass: it ended or was requeued
    assert waiting.ref("b", old) is None and not len(waiting)
