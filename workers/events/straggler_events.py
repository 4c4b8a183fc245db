"""Run events of slow ranks and unbalanced work: a straggler found and recovered, the global batch
rebalanced, a rank moved off a degraded node (and the nodes kept off), pipeline stages re-split.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from workers.events.metric_labels import StragglerAction
from workers.events.run_event import Json, RunEvent


@dataclass(frozen=True)
class StragglerEvent(RunEvent):
    kind: ClassVar[str] = "straggler"
    rank: int
    score: float
    step: int
    policy: str
    decision: StragglerAction
    action: str  # the sentence saying what was done
    node: str | None = None  # the Ray node the rank runs on (a degraded node is the usual cause)

    @property
    def message(self) -> str:
        where = f" on node {self.node[:12]}" if self.node else ""
        return f"rank {self.rank} is slow (score {self.score:.2f}){where}: {self.action}"

    def data(self) -> Json:
        return {"rank": self.rank, "node": self.node, "score": self.score, "step": self.step,
                "policy": self.policy, "action": self.action}


@dataclass(frozen=True)
class StragglerRecoveredEvent(RunEvent):
    kind: ClassVar[str] = "straggler_recovered"
    rank: int
    score: float
    step: int

    @property
    def message(self) -> str:
        return f"rank {self.rank} recovered (score {self.score:.2f})"

    def data(self) -> Json:
        return {"rank": self.rank, "score": self.score, "step": self.step}


@dataclass(frozen=True)
class RebalanceEvent(RunEvent):
    kind: ClassVar[str] = "rebalance"
    shares: tuple[int, ...]
    before: tuple[int, ...]
    step: int

    @property
    def message(self) -> str:
        return (f"global batch rebalanced from {list(self.before)} to {list(self.shares)} after step {self.step}, "
                "without a restart")

    def data(self) -> Json:
        return {"shares": list(self.shares), "from": list(self.before), "step": self.step}


@dataclass(frozen=True)
class ReplaceEvent(RunEvent):
    kind: ClassVar[str] = "replace"
    rank: int
    from_node: str
    to_node: str | None
    step: int
    nodes: tuple[str, ...]
    excluded_nodes: tuple[str, ...]

    @property
    def message(self) -> str:
        return (f"rank {self.rank} moved from node {self.from_node[:12]} to node {(self.to_node or '?')[:12]} "
                f"at step {self.step}")

    def data(self) -> Json:
        return {"rank": self.rank, "from_node": self.from_node, "to_node": self.to_node, "step": self.step,
                "nodes": list(self.nodes), "excluded_nodes": list(self.excluded_nodes)}


@dataclass(frozen=True)
class ExcludedNodesEvent(RunEvent):
    kind: ClassVar[str] = "excluded_nodes"
    nodes: tuple[str, ...]

    @property
    def message(self) -> str:
        return f"ranks stay off {len(self.nodes)} degraded node(s) an earlier supervisor moved them from"

    def data(self) -> Json:
        return {"nodes": list(self.nodes)}


@dataclass(frozen=True)
class PipelineRebalanceEvent(RunEvent):
    kind: ClassVar[str] = "pipeline_rebalance"
    split: tuple[int, ...]
    stage_busy_s: tuple[float, ...]
    step: int

    @property
    def message(self) -> str:
        busy = ", ".join(f"{b * 1e3:.1f}" for b in self.stage_busy_s)
        return (f"pipeline stages unbalanced (busy ms per stage: {busy}); re-split blocks to {list(self.split)} "
                f"from the checkpoint at step {self.step}")

    def data(self) -> Json:
        return {"split": list(self.split), "stage_busy_s": list(self.stage_busy_s), "step": self.step}
