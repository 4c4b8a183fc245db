"""A supervisor's poll makes one call per node, not per rank (workers/runtime/node_leaders.py), and
loses nothing: every step joins all ranks, and a slow rank is still named."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from workers.runtime.node_leaders import MAX_LEADERS, leader_of, node_leaders

ROOT = Path(__file__).resolve().parents[2]


def test_the_lowest_rank_of_each_node_leads_it():
    nodes = ["a", "a", "b", "a", "c", "b"]
    assert node_leaders(nodes) == {0: [0, 1, 3], 2: [2, 5], 4: [4]}
    assert leader_of(nodes) == [0, 0, 2, 0, 4, 2]
    assert len(node_leaders([f"n{r // 8}" for r in range(4096)])) == 512  # 4,096 ranks on 8-GPU nodes


def test_a_job_spread_over_more_nodes_than_the_cap_gets_a_tree_of_whole_nodes():
    # 4,096 ranks packed over partly free nodes: 1 to 8 ranks on each of 1,000 nodes, shuffled.
    rng = random.Random(7)
    nodes = [f"n{i}" for i in range(1000) for _ in range(rng.randint(1, 8))][:4096]
    nodes += ["n999"] * (4096 - len(nodes))
    rng.shuffle(nodes)
    groups = node_leaders(nodes)
    assert len(groups) <= MAX_LEADERS < len(set(nodes))
    assert sorted(r for ranks in groups.values() for r in ranks) == list(range(4096))  # every rank, once
    by_node = {}
    for leader, ranks in groups.items():
        assert leader == min(ranks) == ranks[0]
        for r in ranks:
            assert by_node.setdefault(nodes[r], leader) == leader  # a node is never split between leaders
    assert max(len({nodes[r] for r in ranks}) for ranks in groups.values()) == 2  # ceil(1,000 / 512)
    assert node_leaders(nodes, max_leaders=1000) == node_leaders(nodes, max_leaders=4096)  # one leader per node


@pytest.mark.slow
def test_polls_go_through_node_leaders_on_a_multi_node_ray(tmp_path):
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, "-m", "tests.service.node_poll_scenario", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["summary"]["state"] == "SUCCEEDED", result["summary"]
    (group,) = result["groups"]
    assert len(set(group["nodes"])) == 2 and len(group["nodes"]) == 4
    assert group["calls_per_poll"] == 2  # one call per node, for four ranks
    steps = result["steps"]
    assert [s["step"] for s in steps] == list(range(1, 31))
    assert all(len(s["compute_s"]) == 4 and not s["partial"] for s in steps)  # nothing a follower reported was lost
    slow = [e for e in result["events"] if e["kind"] == "straggler"]
    assert slow and slow[0]["data"]["rank"] == 3, result["events"]
    assert slow[0]["data"]["node"] == group["nodes"][3]  # named by rank and node
