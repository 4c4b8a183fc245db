"""A 16-rank job polled through node leaders on a real 4-node Ray cluster on this machine.

Run as `python -m tests.service.node_scale_scenario OUT.json MODE`; the test reads OUT.json. Nodes: a
head with no CPUs and four nodes of 4 CPUs, so 16 ranks of the tiny GPT sit four to a node.
MODE `faults`: a fault-free run, then the same job with rank 13 slowed 4x from step 2 (the straggler
watch, fed through the leaders, must name it and its node), a node leader's actor killed once step 6
is in (its node's followers are polled themselves; the job restarts from its checkpoint), and rank 5
crashing at step 11 (another restart): its final parameters must equal the fault-free run's.
MODE `node_loss`: one raylet is removed at step 6; the job reshards onto the 12 ranks left.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

from service.ray_client import connect
from service.settings import Settings
from service.supervisor.run import JobRun
from tests.helpers import spec_of
from workers.runtime.group import WorkerGroup

NODES, PER_NODE = 4, 4
SPEC = {"resources.workers": NODES * PER_NODE, "train.steps": 16, "train.global_batch_size": 48,
        "train.micro_batch_size": 3, "checkpoint.every_steps": 4, "supervisor.straggler.policy": "report",
        "supervisor.straggler.window": 3, "fault_tolerance.hang_timeout_s": 300}
# 16 actors importing torch on a 2-core host take minutes to form a group (120 s, the default, timed out)
START_TIMEOUT_S = 900.0
FAULTS = [{"at_step": 2, "rank": 13, "kind": "slow", "factor": 4.0},
          {"at_step": 11, "rank": 5, "kind": "crash"}]
KILL_LEADER_AT = 6
LOSE_NODE_AT = 6


class Recorder:
    """What the test checks: every step's reporting ranks, the events, and a hook on each step."""

    def __init__(self, on_step=None):
        self.events, self.steps, self.on_step_hook = [], [], on_step

    def on_state(self, state, message):
        pass

    def on_event(self, event):
        self.events.append({**event.as_json(), "after": len(self.steps)})

    def on_step(self, record):
        self.steps.append({"step": record["step"], "partial": record.get("partial", False),
                           "ranks": [r["rank"] for r in record["ranks"]]})
        if self.on_step_hook is not None:
            self.on_step_hook(record["step"])


class Groups:
    """The group factory of a run, keeping every group it made (and what each polled) for the test."""

    def __init__(self):
        self.groups: list[WorkerGroup] = []
        self.killed: dict | None = None

    def __call__(self, *args) -> WorkerGroup:
        self.groups.append(WorkerGroup(*args))
        return self.groups[-1]

    def kill_a_leader(self, step: int) -> None:
        """Once, at KILL_LEADER_AT: kill the actor of the leader of the last node (not the node)."""
        if self.killed is None and step >= KILL_LEADER_AT:
            group = self.groups[-1]
            leader = max(r for r, ranks in group.leaders.items() if len(ranks) > 1)
            self.killed = {"attempt": len(self.groups) - 1, "leader": leader, "step": step,
                           "followers": group.leaders[leader][1:]}
            ray.kill(group.actors[leader], no_restart=True)

    def as_json(self) -> list[dict]:
        return [{"nodes": g.nodes, "leaders": {str(k): v for k, v in g.leaders.items()},
                 "calls_per_poll": g.calls_per_poll, "direct": sorted(g.direct)} for g in self.groups]


def run(spec: dict, home: Path, name: str, recorder: Recorder, groups: Groups) -> dict:
    started = time.monotonic()
    summary = JobRun(spec_of(**spec), home / name, name, recorder, start_timeout_s=START_TIMEOUT_S,
                     group_factory=groups).run()
    return {"summary": summary, "events": recorder.events, "steps": recorder.steps, "groups": groups.as_json(),
            "seconds": round(time.monotonic() - started, 1)}


def faults(home: Path) -> dict:
    reference = run(SPEC, home, "reference", Recorder(), Groups())
    groups = Groups()
    faulty = run({**SPEC, "fault_injection": FAULTS}, home, "faults", Recorder(groups.kill_a_leader), groups)
    return {"reference": reference, "faults": faulty, "killed": groups.killed}


def node_loss(home: Path, cluster: Cluster, doomed) -> dict:
    groups, lost = Groups(), dict[str, object]()

    def lose_a_node(step: int) -> None:
        if not lost and step >= LOSE_NODE_AT:
            lost.update(step=step, node=doomed.node_id)
            threading.Thread(target=cluster.remove_node, args=(doomed,)).start()  # kills the raylet and its ranks

    # micro-batches of 1: the 48-sample global batch then also splits over the 12 ranks left
    spec = {**SPEC, "resources.min_workers": 8, "train.micro_batch_size": 1}
    result = run(spec, home, "node_loss", Recorder(lose_a_node), groups)
    return {"node_loss": result, "lost": lost}


def main(out: Path, mode: str) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    nodes = [cluster.add_node(num_cpus=PER_NODE) for _ in range(NODES)]
    cluster.wait_for_nodes()
    connect(Settings(ray_address=cluster.address, home=out.parent / "home"))
    try:
        result = faults(out.parent) if mode == "faults" else node_loss(out.parent, cluster, nodes[-1])
        out.write_text(json.dumps(result))
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
