"""What a straggler policy sees about one slow rank, and what it decides."""

from __future__ import annotations

from dataclasses import dataclass

from workers.events import StragglerAction


@dataclass(frozen=True)
class StragglerStatus:
    rank: int
    step: int
    world_size: int
    score: float = 0.0
    node: str | None = None  # where the slow rank runs now; None while the placement is unknown
    # rebalance: the data-parallel split, where the step can take uneven shares (StepCapabilities)
    uneven_shares: bool = False
    dp: int = 1
    global_batch: int = 0
    per_sample_s: tuple[float, ...] = ()  # each rank's median compute time per sample over the window
    current_shares: tuple[int, ...] = ()
    shares_pending: tuple[int, ...] | None = None  # asked of the ranks, not yet applied
    # replace: room off the slow node and hysteresis
    slots_elsewhere: int = 0  # worker slots off the excluded nodes and the slow node: free + the job's own there
    last_replace_step: int | None = None
    cooldown: int = 16
    pending: bool = False  # a replacement is already planned


@dataclass(frozen=True)
class StragglerDecision:
    kind: StragglerAction
    action: str  # the sentence the straggler event says was done
    shares: tuple[int, ...] | None = None  # REBALANCE_PLANNED: the split to ask the ranks for
    move: tuple[int, str] | None = None  # REPLACE_PLANNED: (rank, node) to move off at the next checkpoint

    @property
    def replace(self) -> bool:
        return self.kind == StragglerAction.REPLACE_PLANNED


def reported(why: str = "") -> StragglerDecision:
    return StragglerDecision(StragglerAction.REPORTED, f"reported ({why})" if why else "reported")
