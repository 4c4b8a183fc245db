"""A node whose raylet stops answering (SIGSTOP: not dead yet to Ray, and no task runs there), asked
about by `node_lost` with and without a cancel, on a real two-node Ray cluster on this machine.

Run as `python -m tests.workers.node_verdict_scenario OUT.json`; the test reads OUT.json.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import ray
from ray.cluster_utils import Cluster

from workers.runtime.node_loss import node_lost


def main(out: str) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    frozen = cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False)
    result = {}
    try:
        cluster.wait_for_nodes()
        os.kill(frozen.all_processes["raylet"][0].process.pid, signal.SIGSTOP)
        started = time.monotonic()  # no verdict and no answer: the whole wait
        result["uncancelled"] = node_lost(frozen.node_id, wait_s=4)
        result["uncancelled_s"] = time.monotonic() - started
        started = time.monotonic()
        result["cancelled"] = node_lost(frozen.node_id, wait_s=60, interrupted=lambda: time.monotonic() > started + 1)
        result["cancelled_s"] = time.monotonic() - started
    finally:
        os.kill(frozen.all_processes["raylet"][0].process.pid, signal.SIGCONT)
        ray.shutdown()
        cluster.shutdown()
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1])
