"""Per-rank notices of one cause are told once, with the number of ranks that reported them."""

from __future__ import annotations

from service.supervisor.notices import merged
from workers.events import CheckpointIncompleteEvent, StoreRecoveredEvent, StoreRetryEvent


def test_a_storage_outage_seen_by_every_rank_is_one_event_per_retry_attempt():
    retries = [StoreRetryEvent(r, f"checkpoint step-40 (rank {r}'s shards)", attempt, 1.0 * attempt, "refused")
               for attempt in (1, 2) for r in reversed(range(4096))]
    recovered = [StoreRecoveredEvent(r, "checkpoint step-40", 2, 3.0 + r / 1000) for r in range(4096)]
    out = merged(retries + recovered)
    assert [(e.kind, e.rank, e.ranks) for e in out] == [("store_retry", 0, 4096), ("store_retry", 0, 4096),
                                                         ("store_recovered", 0, 4096)]
    assert [e.attempt for e in out[:2]] == [1, 2]
    assert out[0].message.startswith("rank 0 and 4095 other ranks: checkpoint step-40 (rank 0's shards) failed")
    assert out[0].data()["ranks"] == 4096


def test_the_same_notice_from_every_rank_is_told_once_and_distinct_ones_stay():
    same = [CheckpointIncompleteEvent(20, ("__1_0.distcp",), 10) for _ in range(8)]
    other = CheckpointIncompleteEvent(30, ("__2_0.distcp",), 20)
    assert merged(same + [other]) == [same[0], other]
    one = StoreRetryEvent(3, "checkpoint step-10 (metadata)", 1, 0.5, "refused")
    assert merged([one]) == [one] and one.message.startswith("rank 3: ")
