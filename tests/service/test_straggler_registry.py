"""A new straggler policy is its own module, one registry line, the spec literal and its test."""

from __future__ import annotations

from service.supervisor.policies.stragglers import STRAGGLER_POLICIES
from tests.fixtures import extra_straggler_policy
from tests.helpers import spec_of
from tests.service.supervisor_fakes import AttemptScript, FakeCluster, Script
from tests.service.test_supervisor_step import Recorder, scripted_run
from workers.events import StragglerAction


def with_policy(spec, name):
    """The spec naming `name`: a real policy adds the name to StragglerSpec.policy (workers/spec/job.py);
    this test-only one is set past validation, so the shipped spec does not know it."""
    straggler = spec.supervisor.straggler.model_copy(update={"policy": name})
    return spec.model_copy(update={"supervisor": spec.supervisor.model_copy(update={"straggler": straggler})})


def test_a_registered_policy_decides_for_a_slow_rank(monkeypatch, tmp_path):
    monkeypatch.setitem(STRAGGLER_POLICIES, "name_node", extra_straggler_policy.on_slow_rank)  # the one line
    spec = with_policy(spec_of(**{"resources.workers": 2, "train.steps": 8, "checkpoint.every_steps": 4,
                                  "supervisor.straggler": {"window": 2}}), "name_node")
    cluster = FakeCluster({"node-a": 1, "node-b": 1})
    script = Script([AttemptScript(per_sample_s=(0.005, 0.02))], total_steps=8)
    rec = Recorder()
    summary = scripted_run(tmp_path, spec, script, cluster, rec).run()
    assert summary["state"] == "SUCCEEDED"
    [event] = rec.of("straggler")
    assert (event.policy, event.rank, event.decision) == ("name_node", 1, StragglerAction.REPORTED)
    assert event.action == "reported (rank 1 runs on node node-b)"
    assert event.node == "node-b" and event.data()["node"] == "node-b"  # named by rank and node
    assert not rec.of("rebalance") and not rec.of("resize")  # it only reported
