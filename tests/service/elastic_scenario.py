"""A node is lost mid-run and later comes back, on a real multi-node Ray cluster on this machine.

Run as `python -m tests.service.elastic_scenario OUT.json`; the test reads OUT.json.
Nodes: a head with no CPUs (so workers land on worker nodes only) and two nodes of
2 CPUs. The job wants 4 workers and may shrink to 2.
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

SPEC = {"resources.workers": 4, "resources.min_workers": 2, "train.steps": 200,
        "checkpoint.every_steps": 5, "checkpoint.keep": 3, "train.global_batch_size": 16}


class Recorder:
    def __init__(self):
        self.states, self.events, self.losses, self.partial = [], [], {}, []
        self.step = 0

    def on_state(self, state, message):
        self.states.append(str(state))

    def on_event(self, kind, message, data):
        self.events.append({"kind": kind, "message": message, "data": data, "at_step": self.step})

    def on_step(self, record):
        self.step = record["step"]
        self.losses[record["step"]] = record["loss"]
        if record.get("partial"):
            self.partial.append(record["step"])


def wait_for(predicate, timeout_s=180.0):
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("scenario condition not reached")
        time.sleep(0.1)


def main(out: Path) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    cluster.add_node(num_cpus=2)
    doomed = cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    connect(Settings(ray_address=cluster.address, home=out.parent / "home"))
    try:
        reference = Recorder()
        JobRun(spec_of(**SPEC), out.parent / "reference", "reference", reference).run()

        elastic = Recorder()
        run = JobRun(spec_of(**SPEC), out.parent / "elastic", "elastic", elastic)
        thread = threading.Thread(target=lambda: setattr(run, "summary_out", run.run()))
        thread.start()
        wait_for(lambda: elastic.step >= 12)
        cluster.remove_node(doomed)  # kills the raylet and the two ranks on it
        lost_at = elastic.step
        wait_for(lambda: any(e["kind"] == "resize" for e in elastic.events) and elastic.step >= lost_at + 10)
        cluster.add_node(num_cpus=2)
        regrow_asked_at = elastic.step
        thread.join(300)
        out.write_text(json.dumps({
            "summary": run.summary_out, "states": elastic.states, "events": elastic.events,
            "losses": elastic.losses, "partial_steps": elastic.partial, "reference_losses": reference.losses, "lost_at": lost_at, "regrow_asked_at": regrow_asked_at,
        }))
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
