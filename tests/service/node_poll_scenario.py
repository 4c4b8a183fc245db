"""Polls through node leaders on a real multi-node Ray cluster on this machine.

Run as `python -m tests.service.node_poll_scenario OUT.json`; the test reads OUT.json. Nodes: a
head with no CPUs and two nodes of 2 CPUs, so a 4-worker job has two ranks on each. Rank 3 turns
3x slower at step 5: the straggler watch, fed through the leaders, must still name it. A leader's
death, crash restarts and node loss at 16 ranks: tests/service/node_scale_scenario.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

from service.ray_client import connect
from service.settings import Settings
from service.supervisor.run import JobRun
from tests.helpers import spec_of
from tests.service.replace_scenario import Recorder
from workers.runtime.group import WorkerGroup

SPEC = {"resources.workers": 4, "train.steps": 30, "train.global_batch_size": 32, "model.d_model": 64,
        "model.n_layers": 1, "checkpoint.every_steps": 5, "supervisor.straggler.policy": "report",
        "supervisor.straggler.window": 5}
SLOW = [{"at_step": 5, "rank": 3, "kind": "slow", "factor": 3.0}]


def main(out: Path) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for _ in range(2):
        cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    connect(Settings(ray_address=cluster.address, home=out.parent / "home"))
    groups: list[WorkerGroup] = []

    def recording(*args) -> WorkerGroup:
        groups.append(WorkerGroup(*args))
        return groups[-1]

    try:
        rec = Recorder()
        summary = JobRun(spec_of(**SPEC, fault_injection=SLOW), out.parent / "job", "job", rec,
                         group_factory=recording).run()
        out.write_text(json.dumps({
            "summary": summary, "events": rec.events, "steps": rec.steps,
            "groups": [{"nodes": g.nodes, "leaders": {str(k): v for k, v in g.leaders.items()},
                        "calls_per_poll": g.calls_per_poll} for g in groups]}))
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
