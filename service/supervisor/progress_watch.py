"""What the run loop knows of its ranks' progress: each rank's latest Progress (a step finished counts as
training progress), when the group last advanced (the hang timer: policies/hang.py), and which long
phases to report as events (PhaseEvent), so that a user sees `evaluating 1,200/3,125 batches` instead of
nothing, and only for phases long enough to matter."""

from __future__ import annotations

from dataclasses import dataclass, field

from service.supervisor.policies.hang import RankPhase, where
from workers.events import PhaseEvent, RankEvent, RankProgress, RankStep
from workers.phases import Phase, Progress


@dataclass
class ProgressWatch:
    started_s: float  # monotonic: the group's start, the hang timer's origin
    total_steps: int
    event_after_s: float  # a phase other than training becomes an event after this long
    event_every_s: float  # and again at most this often while it lasts
    last_progress_s: float = 0.0
    ranks: dict[int, RankPhase] = field(default_factory=dict)
    _since: dict[tuple, float] = field(default_factory=dict)  # a phase (Progress.key) -> when it was first seen
    _reported: dict[tuple, float] = field(default_factory=dict)  # ... -> when it was last reported as an event

    def __post_init__(self) -> None:
        self.last_progress_s = self.last_progress_s or self.started_s

    def observe(self, event: RankEvent, now_s: float) -> bool:
        """Take in one rank event; True when it is progress."""
        if isinstance(event, RankStep):
            progress = Progress(Phase.TRAINING, event.step, self.total_steps)
        elif isinstance(event, RankProgress):
            progress = event.progress
        else:
            return False
        before = self.ranks.get(event.rank)
        if not progress.advanced_from(before.progress if before else None):
            return False
        self.ranks[event.rank] = RankPhase(event.rank, progress, now_s)
        self.last_progress_s = now_s
        if progress.key not in self._since:
            if len(self._since) > 64:  # a long job's phases: keep recent ones only
                self._since, self._reported = {}, {}
            self._since[progress.key] = now_s
        return True

    def phase_events(self, now_s: float) -> list[PhaseEvent]:
        """The job's phase as an event, when it is not training and has lasted `event_after_s` (then at most
        every `event_every_s`)."""
        lead = where(tuple(self.ranks.values()))
        if lead is None or lead.progress.phase == Phase.TRAINING:
            return []
        key = lead.progress.key
        since = self._since.setdefault(key, lead.advanced_s)
        elapsed = now_s - since
        if elapsed < self.event_after_s or now_s - self._reported.get(key, -float("inf")) < self.event_every_s:
            return []
        self._reported[key] = now_s
        return [PhaseEvent(lead.rank, lead.progress, elapsed)]

    def lead(self) -> RankPhase | None:
        return where(tuple(self.ranks.values()))  # tuple() in one go: the drain's thread reads this too

    def phase_view(self) -> dict | None:
        """The job's phase while it is not training (the job view's `phase`), named by the lead rank."""
        lead = self.lead()
        if lead is None or lead.progress.phase == Phase.TRAINING:
            return None
        return {**lead.progress.view(), "rank": lead.rank}
