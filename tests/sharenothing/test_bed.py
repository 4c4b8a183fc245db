"""The share-nothing test bed itself: nodes apart on the network and on disk, yet one Ray cluster."""

from __future__ import annotations

import http.server
import os
import threading

import pytest
import ray

from tests.sharenothing.probe import NodeProbe

pytestmark = pytest.mark.slow


def probe_on(bed, name):
    return NodeProbe.options(resources={bed.node_resource(name): 1}).remote()


def test_cluster_forms_with_every_node_alive(share_nothing):
    states = share_nothing.node_states()
    assert states == {share_nothing.node_ip(n): True for n in share_nothing.names}, states


def test_actors_on_each_node_report_that_nodes_ip(share_nothing, bed_client):
    with bed_client:
        ips = ray.get([probe_on(share_nothing, n).node_ip.remote() for n in share_nothing.names])
    assert ips == [share_nothing.node_ip(n) for n in share_nothing.names]
    assert len(set(ips)) == len(share_nothing.names)


def test_a_file_one_node_writes_is_invisible_to_the_others_and_the_host(share_nothing, bed_client):
    path = os.path.join(share_nothing.storage_path, "jobs", "j1", "shard-0")
    with bed_client:
        writer, *others = [probe_on(share_nothing, n) for n in ("w1", "w2", "head")]
        assert ray.get(writer.write.remote(path, "rank 0"))
        assert ray.get(writer.exists.remote(path))
        assert ray.get([o.exists.remote(path) for o in others]) == [False, False]
    assert not os.path.exists(path)


def test_every_node_reaches_a_service_on_host_ip(share_nothing, bed_client):
    # Where the S3 server will listen: the root namespace's bridge address.
    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"host")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer((share_nothing.host_ip, 0), Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://{share_nothing.host_ip}:{server.server_address[1]}/"
        with bed_client:
            bodies = ray.get([probe_on(share_nothing, n).fetch.remote(url) for n in share_nothing.names])
        assert bodies == ["host"] * len(share_nothing.names)
    finally:
        server.shutdown()


def test_gloo_all_reduce_across_nodes(share_nothing, bed_client):
    names = share_nothing.names
    with bed_client:
        probes = [probe_on(share_nothing, n) for n in names]
        master, port = share_nothing.node_ip(names[1]), ray.get(probes[1].free_port.remote())
        order = [1, 0, *range(2, len(names))]  # rank 0 on the node that owns MASTER_ADDR
        results = ray.get([probes[i].all_reduce.remote(master, port, rank, len(names))
                           for rank, i in enumerate(order)])
    total = sum(range(1, len(names) + 1))
    assert results == [[total * 1.0, total * 2.0]] * len(names)


@pytest.mark.exhaustive  # make test removes nodes under jobs in the soak (tests/api/test_soak.py) and test_elastic
def test_a_killed_node_is_marked_dead_and_comes_back_with_empty_disks(share_nothing, bed_client):
    path = os.path.join(share_nothing.storage_path, "before-the-crash")
    with bed_client:
        assert ray.get(probe_on(share_nothing, "w2").write.remote(path, "lost"))
    share_nothing.kill_node("w2")
    share_nothing.wait_node_state("w2", alive=False, timeout_s=60)
    assert share_nothing.node_states()[share_nothing.node_ip("w2")] is False
    share_nothing.restart_node("w2")
    with bed_client:
        fresh = probe_on(share_nothing, "w2")
        assert ray.get(fresh.node_ip.remote()) == share_nothing.node_ip("w2")
        assert ray.get(fresh.exists.remote(path)) is False  # a replaced machine: its disk is new


def test_stop_leaves_no_namespace_link_or_process(share_nothing):
    # Last in the module: it stops the module's cluster (the fixture's own stop is then a no-op).
    pids = [pid for node in share_nothing.nodes.values() for pid in node.pids()]
    assert pids and len(share_nothing.network.leftovers()) >= 2 * len(share_nothing.names) + 1  # netns, veth, bridge
    share_nothing.stop()
    assert share_nothing.network.leftovers() == []
    assert [p for p in pids if os.path.exists(f"/proc/{p}") and not is_zombie(p)] == []


def is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
