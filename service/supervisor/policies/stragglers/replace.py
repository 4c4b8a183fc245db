"""The `replace` straggler policy: move a slow rank off its node at the next checkpoint.

A replacement restarts the group from the next durable checkpoint with the slow rank's
node excluded (for every rank: a degraded node stays degraded), so it needs room for the
whole group off the excluded nodes. Hysteresis: one replacement pending at a time, and
none within `cooldown` steps of the last one; the detector itself starts afresh after
the restart, so a rank is judged on a full window on its new node.
"""

from __future__ import annotations

from service.supervisor.policies.stragglers.status import StragglerDecision, StragglerStatus, reported
from workers.events import StragglerAction


def on_slow_rank(status: StragglerStatus) -> StragglerDecision:
    if status.node is None:
        return reported("placement unknown")
    if status.pending:
        return reported("a replacement is already pending")
    if status.last_replace_step is not None and status.step - status.last_replace_step < status.cooldown:
        return reported(f"cooldown: last replacement at step {status.last_replace_step}, "
                        f"next from step {status.last_replace_step + status.cooldown}")
    if status.slots_elsewhere < status.world_size:
        return reported(f"no room for {status.world_size} workers off node {status.node[:12]}: "
                        f"{status.slots_elsewhere} slots")
    return StragglerDecision(StragglerAction.REPLACE_PLANNED, f"replacing rank {status.rank} off node "
                                                              f"{status.node[:12]} at the next checkpoint",
                             move=(status.rank, status.node))


def slots_off(nodes_of_ranks: list[str], free_per_node: dict[str, int], excluded: set[str]) -> int:
    """Worker slots the group could use on nodes outside `excluded`: free slots plus its own ranks there."""
    own = {node: nodes_of_ranks.count(node) for node in set(nodes_of_ranks)}
    return sum(free_per_node.get(node, 0) + own.get(node, 0)
               for node in set(free_per_node) | set(own) if node not in excluded)
