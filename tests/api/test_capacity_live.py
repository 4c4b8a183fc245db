"""Admission's view of the cluster's size follows the cluster on every replica: a job refused as
"can never run" is accepted once a node that makes it fit has joined, by the leader and by the
follower alike (the follower used to keep the view it took at start-up, the leader one 10 s old);
a node lost still counts for `node_return_grace_s` (it may come back), then no more.

A Ray cluster of its own (head of 1 CPU) so that the test can add and remove a node."""

from __future__ import annotations

import time

import pytest
from ray.cluster_utils import Cluster

from tests.helpers import tiny_spec
from tests.live import Server, create_pg_schema, drop_pg_schema, pg_schema_url

pytestmark = pytest.mark.slow
TWO_CPUS = tiny_spec(name="needs-2-cpus", **{"resources.workers": 2, "resources.cpus_per_worker": 1})
# A replica refreshes its view every second (service/control.py); the rest is Ray noticing the node.
FOLLOWS_WITHIN_S = 30
GRACE_S = 15


@pytest.fixture
def cluster():
    ray_cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    yield ray_cluster
    ray_cluster.shutdown()


@pytest.fixture
def replicas(tmp_path, cluster):
    schema = create_pg_schema()
    pair = [Server(tmp_path / f"home-{i}", pg_schema_url(schema), cluster.address,
                   TRAINYARD_STORAGE_URI=str(tmp_path / "storage"), TRAINYARD_SCHEDULER_ENABLED="false",
                   TRAINYARD_NODE_RETURN_GRACE_S=str(GRACE_S))
            for i in range(2)]
    try:
        for server in pair:
            server.start()
        yield pair
    finally:
        for server in pair:
            server.stop()
        drop_pg_schema(schema)


def _submit(server: Server) -> tuple[int, dict]:
    with server.client() as c:
        resp = c.post("/v1/jobs", json=TWO_CPUS)
        body = resp.json()
        if resp.status_code == 201:
            c.post(f"/v1/jobs/{body['id']}/cancel").raise_for_status()
        return resp.status_code, body


def _until_every_replica_answers(pair: list[Server], status: int) -> float:
    """Seconds until both replicas gave `status` to the same submit."""
    started = time.monotonic()
    while True:
        answers = [_submit(server) for server in pair]
        if all(code == status for code, _ in answers):
            return time.monotonic() - started
        waited = time.monotonic() - started
        assert waited < FOLLOWS_WITHIN_S + GRACE_S, f"not every replica answered {status}: {answers}"
        time.sleep(0.5)


@pytest.mark.exhaustive  # make test: the view's rules (tests/service/test_cluster_view.py) and the scheduler's grace (test_scheduler)
def test_every_replica_admits_by_the_cluster_as_it_is_now(cluster, replicas):
    refused = [_submit(server) for server in replicas]
    assert [code for code, _ in refused] == [422, 422], refused
    assert all("can never run on this cluster" in str(body) for _, body in refused), refused

    node = cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    assert _until_every_replica_answers(replicas, 201) < FOLLOWS_WITHIN_S

    cluster.remove_node(node)
    removed = time.monotonic()
    assert [code for code, _ in (_submit(server) for server in replicas)] == [201, 201]  # it may come back
    _until_every_replica_answers(replicas, 422)
    # the grace runs from when a replica last saw the node alive: at most one refresh (1 s) before removal
    assert time.monotonic() - removed >= GRACE_S - 1.5
