"""The supervisor's step function driven through a scripted run, without Ray: a rank crashes, a node
is lost (the job shrinks), a rank straggles (the batch is rebalanced live), then the job is preempted.

The fakes (tests/service/supervisor_fakes.py) implement the run loop's own Group and Cluster
interfaces; everything else is the real JobRun with its real policies.
"""

from __future__ import annotations

import time

import pytest

from service.supervisor.policies.failure import RestartsUsed
from service.supervisor.run import JobRun
from tests.helpers import spec_of
from tests.service.supervisor_fakes import AttemptScript, FakeCluster, Script, ScriptedGroup
from workers.events import RestartCause, StragglerAction
from workers.spec import JobSpec


class Recorder:
    def __init__(self):
        self.states, self.events, self.steps = [], [], []
        self.on_step_hook = None

    def on_state(self, state, message):
        self.states.append(str(state))

    def on_event(self, event):
        self.events.append(event)

    def on_step(self, record):
        self.steps.append(record["step"])
        if self.on_step_hook:
            self.on_step_hook(record)

    def of(self, kind):
        return [e for e in self.events if e.kind == kind]


def scripted_run(tmp_path, spec, script, cluster, rec, used=RestartsUsed()):
    run = JobRun(spec, tmp_path, "j", rec, poll_interval_s=0.0, restarts_before=used,
                 group_factory=lambda s, job_dir, attempt, tag, avoid, interrupted: ScriptedGroup(script, cluster, s, job_dir,
                                                                                     attempt),
                 cluster=cluster)
    run.settle_s, run.growth_check_s, run.capacity_poll_s = 0.0, 0.0, 0.01
    return run


def test_crash_node_loss_straggler_and_preemption(tmp_path):
    spec = spec_of(**{"resources.workers": 4, "resources.min_workers": 2, "train.steps": 30,
                      "checkpoint.every_steps": 2, "fault_tolerance.max_restarts": 3,
                      "supervisor.straggler": {"policy": "rebalance", "window": 2}})
    cluster = FakeCluster({"node-a": 2, "node-b": 2})
    script = Script([AttemptScript(fail_at=5),  # a rank crashes: the same layout again, from step 4
                     AttemptScript(fail_at=9, lose_node="node-b"),  # a node goes: shrink to 2, from step 8
                     AttemptScript(per_sample_s=(0.005, 0.015))],  # rank 1 is 3x slower per sample
                    total_steps=30)
    rec = Recorder()
    run = scripted_run(tmp_path, spec, script, cluster, rec)
    rec.on_step_hook = lambda record: run.preempt("high") if record["step"] == 14 else None

    summary = run.run()

    assert rec.states == ["STARTING", "RUNNING", "RECOVERING", "RUNNING", "RECOVERING", "RUNNING", "QUEUED"]
    restarts = rec.of("restart")
    assert [(e.cause, e.resume_step, e.restart) for e in restarts] == [(RestartCause.WORKER_LOST, 4, 1),
                                                                       (RestartCause.WORKER_LOST, 8, 2)]
    assert restarts[0].message.endswith("restart 1/3 (max_restarts)")
    [resize] = rec.of("resize")
    assert (resize.before["world_size"], resize.after["world_size"], resize.direction) == (4, 2, "shrink")
    assert resize.reason == "only 2 worker slots available"
    [straggler] = rec.of("straggler")
    assert (straggler.rank, straggler.step, straggler.decision) == (1, 10, StragglerAction.REBALANCE_PLANNED)
    [rebalance] = rec.of("rebalance")
    assert (rebalance.before, rebalance.shares, rebalance.step) == ((8, 8), (12, 4), 11)
    [preempted] = rec.of("preempted")
    assert (preempted.by, preempted.step, preempted.checkpoint_step) == ("high", 16, 16)

    # Steps replayed after a restart replace the lost ones: one record per step, in order.
    assert [s["step"] for s in run.steps] == list(range(1, 17))
    assert [g.ws for g in script.started] == [4, 4, 2]
    assert script.started[2].shares == [12, 4]  # the split the ranks switched to
    assert summary["state"] == "QUEUED" and summary["restarts"] == 2 and summary["resizes"] == 1
    assert summary["world_size"] == 2 and summary["layout"]["world_size"] == 2
    assert all(n == 0 for n in cluster.used.values()), "every group gave its slots back"


def test_a_run_that_finishes_ends_succeeded_with_the_ranks_results(tmp_path):
    spec = spec_of(**{"resources.workers": 2, "train.steps": 6, "checkpoint.every_steps": 2})
    cluster = FakeCluster({"node-a": 2})
    script = Script([AttemptScript()], total_steps=6)
    rec = Recorder()
    summary = scripted_run(tmp_path, spec, script, cluster, rec).run()
    assert rec.states == ["STARTING", "RUNNING", "SUCCEEDED"]
    assert summary["steps"] == 6 and summary["final_val_loss"] == 1.5 and summary["params_sha256"] == "abc"
    assert [e.step for e in rec.of("checkpoint")] == [2, 4]


def test_a_crash_past_the_restart_budget_fails_the_job(tmp_path):
    spec = spec_of(**{"resources.workers": 2, "train.steps": 6, "fault_tolerance.max_restarts": 1})
    cluster = FakeCluster({"node-a": 2})
    script = Script([AttemptScript(fail_at=1), AttemptScript(fail_at=1)], total_steps=6)
    rec = Recorder()
    summary = scripted_run(tmp_path, spec, script, cluster, rec).run()
    assert rec.states[-1] == "FAILED" and summary["restarts"] == 1
    assert "restart budget exhausted (max_restarts 1/1)" in summary["error"]


def test_a_replacement_supervisor_inherits_the_jobs_restarts(tmp_path):
    """The budgets are the job's: a supervisor started after 2 restarts (one a lost node) has one left."""
    spec = spec_of(**{"resources.workers": 2, "train.steps": 6, "fault_tolerance.max_restarts": 2})
    script = Script([AttemptScript(fail_at=1), AttemptScript(fail_at=1)], total_steps=6)
    rec = Recorder()
    used = RestartsUsed(job=1, infra=1)
    summary = scripted_run(tmp_path, spec, script, FakeCluster({"node-a": 2}), rec, used).run()
    assert rec.states[-1] == "FAILED" and summary["restarts"] == 1
    assert [e.restart for e in rec.of("restart")] == [3]  # numbered over the job
    assert "restart budget exhausted (max_restarts 2/2)" in summary["error"]


@pytest.mark.parametrize("ignores_stop", [False, True])
@pytest.mark.parametrize("ask", ["cancel", "preempt"])
def test_a_program_asked_to_stop_gets_its_grace_period(tmp_path, ask, ignores_stop):
    spec = JobSpec.model_validate({"name": "p", "resources": {"workers": 2},
                                   "program": {"command": ["python", "train.py"], "grace_period_s": 0.3}})
    cluster = FakeCluster({"node-a": 2})
    script = Script([AttemptScript(ignores_stop=ignores_stop)], total_steps=10_000)
    rec = Recorder()
    run = scripted_run(tmp_path, spec, script, cluster, rec)
    asked: list[float] = []

    def ask_at_step_5(record):
        if record["step"] == 5 and not asked:
            asked.append(time.monotonic())
            run.cancel() if ask == "cancel" else run.preempt("high")

    rec.on_step_hook = ask_at_step_5
    summary = run.run()
    waited = time.monotonic() - asked[0]
    assert script.started[0].stop_asked  # should_stop() became True first
    assert summary["state"] == ("CANCELLED" if ask == "cancel" else "QUEUED")
    if ignores_stop:  # killed once the grace period is over, not before
        assert 0.3 <= waited < 5.0
    else:  # it saved and returned at its next checkpoint
        assert waited < 0.3 and summary["steps"] == 6


def test_steps_the_survivors_reported_after_the_last_poll_are_kept(tmp_path):
    """Rank 1 dies after the others trained steps 4 (a checkpoint) and 5, unpolled. The next attempt
    resumes from step 4, so step 4 is never trained again: only the survivors' report can record it."""
    spec = spec_of(**{"resources.workers": 2, "train.steps": 8, "checkpoint.every_steps": 4})
    script = Script([AttemptScript(fail_at=3, unpolled_steps=2), AttemptScript()], total_steps=8,
                    checkpoint_every=4)
    rec = Recorder()
    summary = scripted_run(tmp_path, spec, script, FakeCluster({"node-a": 2}), rec).run()
    assert summary["state"] == "SUCCEEDED" and summary["restarts"] == 1
    assert rec.steps == [1, 2, 3, 4, 5, 5, 6, 7, 8]  # 5 trained again from the checkpoint at 4
    assert [e.step for e in rec.of("checkpoint")] == [4]
    assert script.started[1].step == 8 and script.started[0].step == 5
