"""parallel.collectives 'hierarchical' as a job on hosts that share nothing (issue 50): two worker hosts of two
ranks each (the head holds none), links shaped with tc. The placement's node map reaches the ranks, the
hierarchical job ends with flat's loss (1e-6), and fewer bytes cross hosts, as counted by the hook and
as the hosts' NICs sent them. The measured table is bench/hierarchical.py's."""

from __future__ import annotations

import pytest

from tests.helpers import spec_of
from tests.sharenothing.cluster import ShareNothingCluster
from tests.sharenothing.shaping import shaped, train_on_bed

# The bed and two 4-rank jobs: minutes on the shared host. make test runs the numeric equality on real gloo
# groups (tests/workers/test_hierarchical_collectives.py).
pytestmark = [pytest.mark.slow, pytest.mark.exhaustive]

WORKERS = ["w1", "w2"]
JOB = {"resources.workers": 4, "resources.cpus_per_worker": 1, "parallel.dp": 4, "train.steps": 6,
       "model.d_model": 64, "data.max_bytes": 50_000}


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    cluster = ShareNothingCluster(tmp_path_factory.mktemp("bed"), workers=2, num_cpus=2, head_cpus=0).start()
    yield cluster
    cluster.stop()


def test_hierarchical_matches_flat_and_sends_less_between_hosts(bed):
    specs = {"flat": spec_of(**JOB), "hierarchical": spec_of(**JOB, **{"parallel.collectives": "hierarchical"})}
    with shaped(bed, WORKERS, rate="1gbit"):  # tbf: this host's kernel has no netem for a delay
        runs = train_on_bed(bed, specs, WORKERS)
    flat, hier = runs["flat"]["summary"], runs["hierarchical"]["summary"]
    assert flat["state"] == hier["state"] == "SUCCEEDED", (flat.get("error"), hier.get("error"))
    assert abs(flat["final_loss"] - hier["final_loss"]) <= 1e-6, (flat["final_loss"], hier["final_loss"])
    # 2 hosts x 2 ranks: flat's ring leaves each host once (1.5 x the gradient), hierarchical sends each host's
    # half over 2 ranks (1.0 x): 2/3.
    assert flat["cross_node_bytes_per_step"] > 0, flat
    assert hier["cross_node_bytes_per_step"] == pytest.approx(flat["cross_node_bytes_per_step"] * 2 / 3, rel=0.05)
    assert runs["hierarchical"]["crossed_bytes"] < runs["flat"]["crossed_bytes"], runs
