"""A run's answer to stragglers: ask the spec's straggler policy, apply its decision, report it.

Owns the data split the ranks train on (after a live rebalance) and the bookkeeping of rank
moves (straggler replace); JobRun calls it with the live attempt.
"""

from __future__ import annotations

import logging

from service.supervisor.attempt import Attempt
from service.supervisor.cluster import Cluster, Group
from service.supervisor.listener import RunListener
from service.supervisor.policies.stragglers import rank_terms, straggler_policy
from service.supervisor.policies.stragglers.rebalance import even_shares
from service.supervisor.policies.stragglers.replace import slots_off
from service.supervisor.policies.stragglers.status import StragglerStatus
from service.supervisor.stragglers import StragglerChange
from workers.events import RankShares, RebalanceEvent, ReplaceEvent, StragglerEvent, StragglerRecoveredEvent
from workers.parallel.layouts import step_capabilities
from workers.spec import JobSpec
from workers.training.control import UnevenShares

log = logging.getLogger("trainyard.supervisor")


class StragglerResponse:
    def __init__(self, spec: JobSpec, listener: RunListener, cluster: Cluster):
        self.spec, self.listener, self.cluster = spec, listener, cluster
        self.shares: list[int] | None = None  # uneven data split after a rebalance; kept on restarts
        self._shares_version = 0  # of the last data split asked of the ranks (workers/training/control.py)
        self.moved: tuple[int, str, int] | None = None  # (rank, from node, step) for the next group to report
        self._last_replace_step: int | None = None

    def rank_terms(self, current: JobSpec) -> UnevenShares | None:
        """What the next group's ranks start under: the policy's typed terms, never its name."""
        return rank_terms(current, self.shares)

    def current_shares(self, current: JobSpec) -> list[int]:
        return self.shares or even_shares(self.spec.train.global_batch_size, current.dp)

    def on_change(self, live: Attempt, change: StragglerChange, current: JobSpec, avoid_nodes: set[str]) -> None:
        if not change.slow:
            self.listener.on_event(StragglerRecoveredEvent(change.rank, change.score, change.step))
            return
        policy = self.spec.supervisor.straggler.policy
        decision = straggler_policy(policy)(self._status(live, change, current, avoid_nodes))
        if decision.shares is not None:  # the ranks switch together at their next agreement step
            self._shares_version += 1
            live.shares_pending = decision.shares
            live.group.request_shares(self._shares_version, list(decision.shares))
        if decision.move is not None:  # the run restarts without that node at the next checkpoint
            live.replace = decision.move
        log.info("straggler: rank %d score %.2f at step %d: %s", change.rank, change.score, change.step,
                 decision.action)
        nodes = live.group.nodes
        node = nodes[change.rank] if change.rank < len(nodes) else None
        self.listener.on_event(StragglerEvent(change.rank, change.score, change.step, policy, decision.kind,
                                              decision.action, node))

    def _status(self, live: Attempt, change: StragglerChange, current: JobSpec,
                avoid_nodes: set[str]) -> StragglerStatus:
        config, nodes = self.spec.supervisor.straggler, live.group.nodes
        node = nodes[change.rank] if change.rank < len(nodes) else None
        elsewhere = (slots_off(nodes, self.cluster.free_slots_per_node(live.group.bundle()), avoid_nodes | {node})
                     if node is not None else 0)
        return StragglerStatus(
            rank=change.rank, step=change.step, world_size=current.world_size, score=change.score, node=node,
            uneven_shares=step_capabilities(current).uneven_shares, dp=current.dp,
            global_batch=self.spec.train.global_batch_size,
            per_sample_s=live.stragglers.per_sample_medians(), current_shares=tuple(self.current_shares(current)),
            shares_pending=live.shares_pending, slots_elsewhere=elsewhere, last_replace_step=self._last_replace_step,
            cooldown=config.cooldown or 2 * config.window, pending=live.replace is not None)

    def on_shares(self, live: Attempt, event: RankShares, current: JobSpec) -> None:
        """The ranks switched to a rebalanced split after `event.step`: judge every rank afresh on it."""
        before = self.current_shares(current)
        self.shares, live.shares_pending = list(event.shares), None
        live.stragglers.reset(event.step)
        rebalanced = RebalanceEvent(event.shares, tuple(before), event.step)
        log.info(rebalanced.message)
        self.listener.on_event(rebalanced)

    def report_move(self, group: Group, avoid_nodes: set[str]) -> None:
        """After a replacement: say which rank moved from which node to which."""
        if self.moved is None:
            return
        rank, before, step = self.moved
        self.moved, self._last_replace_step = None, step
        event = ReplaceEvent(rank, before, group.nodes[rank] if rank < len(group.nodes) else None, step,
                             tuple(group.nodes), tuple(sorted(avoid_nodes)))
        log.info("replace: %s", event.message)
        self.listener.on_event(event)
