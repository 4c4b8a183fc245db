"""A node is lost mid-run and later comes back, on a real multi-node Ray cluster on this machine.

Run as `python -m tests.service.elastic_scenario OUT.json [LAYOUT]`; the test reads OUT.json.
Nodes: a head with no CPUs (so workers land on worker nodes only) and two nodes of
2 CPUs. The job wants 4 workers and may shrink to 2. LAYOUT picks the parallel layout
on 4 workers: `dp` (dp=4), `pp` (pp=2 x dp=2) or `tp` (tp=2 x dp=2); the re-planner keeps
pp or tp on the 2 survivors (dp=1) and the same global batch. `dp` trains on sharded token files
read by loader workers: its loss curve matching the fault-free run's through 4 -> 2 -> 4 shows that
a resize keeps the file dataset's global batches.
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
from tests.fixtures.data_files import token_shards
from tests.helpers import spec_of

BASE = {"resources.workers": 4, "resources.min_workers": 2, "train.steps": 200,
        "checkpoint.every_steps": 5, "checkpoint.keep": 3, "train.global_batch_size": 16}
# Model-parallel layouts run fewer steps: each step costs more ranks' worth of CPU on this host.
LAYOUTS = {
    "dp": {},  # on sharded token files read by loader workers (file_data): a resize keeps their global batches
    # pp steps are quick on a quiet host: 60 ended before the returned node could be used (no regrow)
    "pp": {"parallel.pp": 2, "model.n_layers": 2, "train.steps": 150},
    # tp too, once its plan runs through the generic tensor_plan (a clean-checkout make test: 60 steps ended
    # shrunk, before the returned node was used)
    "tp": {"parallel.tp": 2, "train.steps": 120},
}


class Recorder:
    def __init__(self):
        self.states, self.events, self.losses, self.partial = [], [], {}, []
        self.step = 0

    def on_state(self, state, message):
        self.states.append(str(state))

    def on_event(self, event):
        self.events.append({**event.as_json(), "at_step": self.step})

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


def file_data(directory: Path) -> dict:
    """`data.files` over token shards written here, read by a loader worker per rank."""
    pattern = token_shards(directory, shards=4, tokens_per_shard=50_000)
    return {"files": {"paths": [pattern], "format": "tokens", "dtype": "uint16", "seq_len": 32},
            "loader": {"num_workers": 1}}


def main(out: Path, layout: str = "dp") -> None:
    spec = {**BASE, **LAYOUTS[layout]}
    if layout == "dp":
        spec["data"] = file_data(out.parent / "data")
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    cluster.add_node(num_cpus=2)
    doomed = cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    connect(Settings(ray_address=cluster.address, home=out.parent / "home"))
    try:
        reference = Recorder()
        JobRun(spec_of(**spec), out.parent / "reference", "reference", reference).run()

        elastic = Recorder()
        run = JobRun(spec_of(**spec), out.parent / "elastic", "elastic", elastic)
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
            "losses": elastic.losses, "partial_steps": elastic.partial, "reference_losses": reference.losses,
            "lost_at": lost_at, "regrow_asked_at": regrow_asked_at, "steps": spec["train.steps"],
        }))
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), *sys.argv[2:3])
