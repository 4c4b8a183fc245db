"""JobRun's part for the trainers an attempt trains on without (the parameter server's async trainers: the
worker group sheds a dead one, workers/runtime/lost_ranks.py) and the ones an elastic job re-adds in their
places (docs/parallel.md, "A lost trainer under async", "Elastic trainers under async")."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from service.supervisor.attempt import Attempt
from service.supervisor.listener import RunListener
from workers.events import ResizeEvent
from workers.spec import JobSpec

log = logging.getLogger("trainyard.supervisor")


class LostTrainers:
    """A mixin over JobRun's state: each lost trainer a shrink, each re-added one a grow."""

    rejoin_after_s = 2.0  # an elastic async parameter-server job re-adds a lost trainer this long after its loss
    spec: JobSpec
    current: JobSpec
    listener: RunListener
    resizes: int
    lost_trainers: list[int]  # ranks of the running attempt lost while the others go on
    lost_at: dict[int, float]  # lost rank -> when (monotonic): a rejoin waits rejoin_after_s

    def layout(self, spec: JobSpec | None = None) -> dict[str, Any]:
        raise NotImplementedError

    def _append_step(self, record: dict) -> None:
        raise NotImplementedError

    def _shrink_by_lost(self, live: Attempt) -> None:
        """Ranks the group lost while the others train on (the parameter server's async trainers,
        workers/runtime/group.py `sheds_lost_ranks`): a shrink event each, and steps wait no more for them."""
        take_lost = getattr(live.group, "take_lost", None)
        for rank, reason in take_lost() if take_lost is not None else ():
            before = self.layout()
            self.lost_trainers.append(rank)
            self.lost_at[rank] = time.monotonic()
            after = {**before, "world_size": before["world_size"] - 1, "dp": before["dp"] - 1}
            self.resizes += 1
            event = ResizeEvent(before, after, f"trainer {rank} lost, the others train on without it "
                                               f"(parameter server, async; the shards keep running): {reason}")
            log.warning("resize %s", event.message)
            self.listener.on_event(event)
            for record in live.aggregator.drop_rank(rank):
                self._append_step(record)
        take_joined = getattr(live.group, "take_joined", None)
        for rank, step in take_joined() if take_joined is not None else ():
            before = self.layout()
            self.lost_trainers.remove(rank)
            after = {**before, "world_size": before["world_size"] + 1, "dp": before["dp"] + 1}
            self.resizes += 1
            live.aggregator.add_rank(rank)
            event = ResizeEvent(before, after, f"trainer {rank} joined the running shards at step {step} (parameter "
                                               f"server, async: nothing restored)")
            log.info("resize %s", event.message)
            self.listener.on_event(event)
        self._rejoin_lost(live)

    def _rejoin_lost(self, live: Attempt) -> None:
        """An elastic job (resources.max_workers set) re-adds each lost trainer rejoin_after_s after its loss, in
        its placement-group bundle: the new rank pulls the shards' current state and trains on (async PS)."""
        if self.spec.resources.max_workers is None or not self.lost_trainers:
            return
        rejoin = getattr(live.group, "rejoin", None)
        now = time.monotonic()
        for rank in self.lost_trainers:
            if rejoin is not None and now - self.lost_at.get(rank, now) >= self.rejoin_after_s:
                self.lost_at[rank] = math.inf  # asked once; the group starts it when its set-up answers
                log.info("re-adding trainer %d to the running shards", rank)
                rejoin(rank)
