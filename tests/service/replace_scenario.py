"""The `replace` straggler policy on a real multi-node Ray cluster on this machine.

Run as `python -m tests.service.replace_scenario OUT.json`; the test reads OUT.json.
Nodes: a head with no CPUs and three nodes of 1 CPU, so each rank of a 2-worker job
has a node to itself and one node is spare. A clean run comes first (no straggler
may be reported), then a run whose rank 1 turns 3x slower at step 5 on its node.
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

SPEC = {"resources.workers": 2, "train.steps": 60, "train.global_batch_size": 32, "model.d_model": 128,
        "model.n_layers": 2, "checkpoint.every_steps": 5, "supervisor.straggler.policy": "replace",
        "supervisor.straggler.window": 6}
SLOW = [{"at_step": 5, "rank": 1, "kind": "slow", "factor": 3.0}]


class Recorder:
    def __init__(self):
        self.events, self.steps = [], []

    def on_state(self, state, message):
        pass

    def on_event(self, event):
        # `after`: how many step records came before it (steps replayed after a restart repeat numbers).
        self.events.append({**event.as_json(), "after": len(self.steps)})

    def on_step(self, record):
        self.steps.append({"step": record["step"], "samples_per_s": record["samples_per_s"],
                           "partial": record.get("partial", False),
                           "compute_s": [r["compute_time_s"] for r in record["ranks"]],
                           "scores": [r.get("straggler_score") for r in record["ranks"]]})


def main(out: Path) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for _ in range(3):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    connect(Settings(ray_address=cluster.address, home=out.parent / "home"))
    try:
        result = {"nodes": [n["NodeID"] for n in ray.nodes() if n["Resources"].get("CPU")]}
        for name, faults in (("clean", []), ("slow", SLOW)):
            rec = Recorder()
            summary = JobRun(spec_of(**SPEC, fault_injection=faults), out.parent / name, name, rec).run()
            marker = out.parent / name / "faults" / "fired-0"
            result[name] = {"summary": summary, "events": rec.events, "steps": rec.steps,
                            "slow_node": marker.read_text().strip() if marker.exists() else None}
        # The job's next supervisor (after a restart) starts with the degraded node still excluded.
        rec = Recorder()
        resumed = JobRun(spec_of(**SPEC, fault_injection=SLOW), out.parent / "slow", "slow", rec)
        result["resumed"] = {"avoid_nodes": sorted(resumed.avoid_nodes), "summary": resumed.run(),
                             "events": rec.events}
        out.write_text(json.dumps(result))
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
