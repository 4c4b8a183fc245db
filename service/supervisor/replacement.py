"""The `replace` straggler policy: whether to move a slow rank off its node, as a pure decision.

A replacement restarts the group from the next durable checkpoint with the slow
rank's node excluded (for every rank: a degraded node stays degraded), so it needs
room for the whole group off the excluded nodes. Hysteresis: one replacement pending
at a time, and none within `cooldown` steps of the last one; the detector itself starts
afresh after the restart, so a rank is judged on a full window on its new node.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReplaceStatus:
    rank: int
    node: str  # where the slow rank runs now
    step: int
    world_size: int
    slots_elsewhere: int  # worker slots off the excluded nodes and the slow node: free ones + the job's own there
    last_replace_step: int | None = None
    cooldown: int = 16
    pending: bool = False


@dataclass(frozen=True)
class ReplaceDecision:
    replace: bool
    action: str  # what the straggler event says was done


def on_slow_rank(status: ReplaceStatus) -> ReplaceDecision:
    if status.pending:
        return ReplaceDecision(False, "reported (a replacement is already pending)")
    if status.last_replace_step is not None and status.step - status.last_replace_step < status.cooldown:
        return ReplaceDecision(False, f"reported (cooldown: last replacement at step {status.last_replace_step}, "
                                      f"next from step {status.last_replace_step + status.cooldown})")
    if status.slots_elsewhere < status.world_size:
        return ReplaceDecision(False, f"reported (no room for {status.world_size} workers off node "
                                      f"{status.node[:12]}: {status.slots_elsewhere} slots)")
    return ReplaceDecision(True, f"replacing rank {status.rank} off node {status.node[:12]} at the next checkpoint")


def slots_off(nodes_of_ranks: list[str], free_per_node: dict[str, int], excluded: set[str]) -> int:
    """Worker slots the group could use on nodes outside `excluded`: free slots plus its own ranks there."""
    own = {node: nodes_of_ranks.count(node) for node in set(nodes_of_ranks)}
    return sum(free_per_node.get(node, 0) + own.get(node, 0)
               for node in set(free_per_node) | set(own) if node not in excluded)
