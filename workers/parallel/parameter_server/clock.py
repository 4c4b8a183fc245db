"""When a trainer may pull the rows for a step, and how stale what it reads then is.

Each trainer's clock is the number of steps whose push the shard has applied (or, under sync, received).
A pull for step t (0-based) reads rows that have every trainer's pushes of steps < min(clocks): its
staleness is t - min(clocks), the steps of some trainer's updates it may miss.
  sync:    wait until min(clocks) >= t (staleness 0): the same math as data parallelism
  bounded: wait until t - min(clocks) <= staleness (stale-synchronous parallel, Ho et al. 2013)
  async:   never wait (staleness is whatever it is)
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepClock:
    trainers: int
    mode: str  # sync | bounded | async
    staleness: int = 0  # bounded: the most steps a pull may run ahead of the slowest trainer
    clocks: list[int] = field(default_factory=list)
    left: set[int] = field(default_factory=set)  # async: trainers lost for good (their clocks stop)

    def __post_init__(self) -> None:
        if not self.clocks:
            self.clocks = [0] * self.trainers

    @property
    def live(self) -> list[int]:
        return [t for t in range(self.trainers) if t not in self.left]

    @property
    def slowest(self) -> int:
        """The slowest live trainer's clock (a lost one's stopped clock would hold every staleness up)."""
        return min((self.clocks[t] for t in self.live), default=max(self.clocks, default=0))

    def leave(self, trainer: int) -> None:
        self.left.add(trainer)

    def finished(self, steps: int) -> bool:
        """Every live trainer's push of its last step (`steps` in all) is in."""
        return all(self.clocks[t] >= steps for t in self.live)

    def bound(self) -> int | None:
        """How far ahead of the slowest trainer a pull may be; None: unbounded."""
        return 0 if self.mode == "sync" else self.staleness if self.mode == "bounded" else None

    def may_pull(self, step: int) -> bool:
        bound = self.bound()
        return bound is None or step - self.slowest <= bound

    def staleness_of(self, step: int) -> int:
        return max(0, step - self.slowest)

    def advance(self, trainer: int, step: int) -> None:
        """Trainer `trainer`'s push of step `step` (0-based) is in."""
        self.clocks[trainer] = max(self.clocks[trainer], step + 1)

    def state_dict(self) -> dict:
        return {"clocks": list(self.clocks)}

    def load_state_dict(self, state: dict) -> None:
        self.clocks = list(state["clocks"])
