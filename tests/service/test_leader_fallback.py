"""A node leader's actor dies: its node's other ranks are polled themselves from that poll on, and
nothing they reported is lost or told twice, not even what they had handed the leader before it died.

Real TrainWorker actors on the session's Ray, wired by WorkerGroup.appoint_leaders as a job's are;
two nodes by name (a, b), so that one process can kill one node's leader without a training loop. A
follower's own events are given to it through `relay`, the same path its trainer's reach the hand-over.
"""

from __future__ import annotations

import time

import ray

from tests.helpers import spec_of
from workers.events import RankCheckpoint
from workers.runtime.actor import HAND_OVER_S, TrainWorker
from workers.runtime.group import WorkerGroup
from workers.runtime.group_owner import GroupOwner
from workers.storage import Storage

HANDED_OVER_S = 5 * HAND_OVER_S  # long enough for a follower's hand-over loop to have run


def _group(tmp_path) -> WorkerGroup:
    group = WorkerGroup(spec_of(**{"resources.workers": 4}), Storage.of(tmp_path), 0, GroupOwner("fallback", 0))
    group.actors = [TrainWorker.options(num_cpus=0).remote(preload=False) for _ in range(4)]  # type: ignore[attr-defined]
    ray.get([a.assign.remote(r, 4, str(tmp_path), f"rank-{r}.log") for r, a in enumerate(group.actors)], timeout=60)
    group.nodes = ["a", "a", "b", "b"]
    group.appoint_leaders(timeout_s=30)
    return group


def _report(group: WorkerGroup, rank: int, *steps: int) -> None:
    """Rank `rank` reports checkpoints at `steps`, as its loop would."""
    ray.get(group.actors[rank].relay.remote(rank, 0, [RankCheckpoint(rank, s, None) for s in steps]), timeout=30)


def _seen(events) -> list[tuple[int, int]]:
    return sorted((e.rank, e.step) for e in events)


def test_a_dead_leaders_followers_are_polled_themselves_and_lose_nothing(ray_cluster, tmp_path):
    group = _group(tmp_path)
    try:
        assert group.leaders == {0: [0, 1], 2: [2, 3]}
        for rank in range(4):
            _report(group, rank, 1)
        time.sleep(HANDED_OVER_S)
        assert _seen(group.poll()) == [(r, 1) for r in range(4)]
        assert group.calls_per_poll == 2  # one call per node

        _report(group, 3, 2, 3)
        time.sleep(HANDED_OVER_S)  # handed to leader 2, which no poll has taken them from
        ray.kill(group.actors[2], no_restart=True)
        _report(group, 3, 4)  # its hand-over now fails: kept by rank 3
        _report(group, 1, 2)
        time.sleep(HANDED_OVER_S)
        first = group.poll(timeout_s=20)
        assert _seen(first) == [(1, 2), (3, 2), (3, 3), (3, 4)]  # the dead leader's unpolled hand-over, once
        assert group.direct == {3}
        assert group.calls_per_poll == 3  # node b's other rank, polled in the same poll as its leader's death

        _report(group, 3, 5)
        time.sleep(HANDED_OVER_S)
        assert _seen(group.poll(timeout_s=20)) == [(3, 5)]  # from then on, directly, nothing twice
        assert group.calls_per_poll == 3  # leader 0, the dead leader (check() reports it), rank 3
    finally:
        group.shutdown()
