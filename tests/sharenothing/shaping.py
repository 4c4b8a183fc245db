"""Shaped links between the bed's hosts, the bytes that cross them, and jobs trained on the bed.

    with shaped(bed, ["w1", "w2"], rate="1gbit"):   # tc tbf on each node's eth0 (egress); delay=: netem
        before = sent_bytes(bed, ["w1", "w2"])
        summaries = train_on_bed(bed, {"flat": spec, ...}, ["w1", "w2"])
        crossed = sent_bytes(bed, ["w1", "w2"]) - before

A node's traffic to another node leaves by its own eth0 and reaches the other through the bridge, so
shaping every node's egress shapes each direction of every link between hosts once; a node's ranks
talk to each other over its loopback, which stays unshaped (the fast intra-node link). What a node
sends to the others (and to the head and the host) is counted on the host end of its veth (rx_bytes).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

from tests.sharenothing.cluster import ShareNothingCluster


def _tc(bed: ShareNothingCluster, name: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", bed.network.namespaces[name], "tc", *args],
                          capture_output=True, text=True, check=check)


@contextlib.contextmanager
def shaped(bed: ShareNothingCluster, names: list[str], rate: str = "1gbit", delay: str | None = None) -> Iterator[None]:
    """Each node's egress at `rate` (a token bucket, tbf), with `delay` added where given (netem, which some
    kernels lack: there it fails by name); removed on exit (and with the namespace)."""
    shape = (["netem", "delay", delay, "rate", rate, "limit", "100000"] if delay
             else ["tbf", "rate", rate, "burst", "256kb", "latency", "50ms"])
    try:
        for name in names:
            done = _tc(bed, name, "qdisc", "replace", "dev", "eth0", "root", *shape, check=False)
            if done.returncode:
                raise RuntimeError(f"tc could not shape {name}'s link with {shape[0]}: {done.stderr.strip()}")
        yield
    finally:
        for name in names:
            _tc(bed, name, "qdisc", "del", "dev", "eth0", "root", check=False)


def qdiscs(bed: ShareNothingCluster, name: str) -> str:
    return _tc(bed, name, "qdisc", "show", "dev", "eth0").stdout


def sent_bytes(bed: ShareNothingCluster, names: list[str]) -> int:
    """Bytes the nodes have sent out of their eth0 so far (the host end of each one's veth received them)."""
    total = 0
    for name in names:
        index = bed.names.index(name)
        total += int(Path(f"/sys/class/net/{bed.network.tag}h{index}/statistics/rx_bytes").read_text())
    return total


def _supervise(spec_json: dict, job_dir: str, job_id: str) -> dict:
    """A job's JobRun on the node this task runs on, as the service's supervisor actor runs it."""
    from service.supervisor.run import JobRun
    from workers.spec import JobSpec

    return JobRun(JobSpec.model_validate(spec_json), job_dir, job_id, start_timeout_s=300.0).run()


def train_on_bed(bed: ShareNothingCluster, specs: dict, nodes: list[str]) -> dict[str, dict]:
    """Train each spec to its end on the bed, one after the other, its JobRun on the head (Ray Client from
    this process); name -> {"summary", "crossed_bytes": what `nodes` sent meanwhile, "wall_s"}."""
    import ray
    import ray.util.client

    from service.ray_client import NAMESPACE, worker_env

    os.environ["RAY_AUTH_MODE"] = "disabled"  # the bed's private subnet runs without token auth
    # A client context of its own, beside any local Ray this process holds (tests/sharenothing/conftest.py,
    # whose retry this is: Ray's client proxy can lose the server it starts for a client on a loaded host).
    for attempt in range(3):
        own = ray.util.client.ray.get_context()
        try:
            ctx = ray.init(bed.client_address, allow_multiple=True, namespace=NAMESPACE, log_to_driver=False,
                           runtime_env={"env_vars": worker_env()})
            break
        except ConnectionAbortedError:
            ray.util.client.ray.set_context(own)
            if attempt == 2:
                raise
    bed.on_stop(ctx.disconnect)  # before the head goes
    out = {}
    with ctx:
        supervise = ray.remote(_supervise).options(num_cpus=0, resources={bed.node_resource("head"): 0.01})
        for name, spec in specs.items():
            before, start = sent_bytes(bed, nodes), time.monotonic()
            job_dir = f"{bed.storage_path}/jobs/{name}"  # the head's private disk
            summary = ray.get(supervise.remote(spec.model_dump(mode="json"), job_dir, f"{name}-{int(time.time())}"))
            out[name] = {"summary": summary, "crossed_bytes": sent_bytes(bed, nodes) - before,
                         "wall_s": time.monotonic() - start}
    return out
