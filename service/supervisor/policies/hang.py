"""The hang policy: a group is hung when no rank has made progress for `hang_timeout_s`, whatever the phase.

Progress is a step finished, or a rank's report of a phase outside the steps advancing (validation
batches, checkpoint bytes, set-up and export stages, the first step's micro-batches: workers/phases.py
Progress). A rank that only repeats where it is makes none. So a long validation or a slow upload that
keeps moving is not a hang, and one that stops is, after the same timeout as a stopped step.

A program (the user's own loop) that has not reported yet can only die, not hang: its loop is its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from workers.phases import Phase, Progress


@dataclass(frozen=True)
class RankPhase:
    """Where one rank is, as the supervisor last heard: its latest progress and when it last advanced."""

    rank: int
    progress: Progress
    advanced_s: float  # monotonic


@dataclass(frozen=True)
class HangStatus:
    now_s: float
    last_progress_s: float  # any rank's last advance (monotonic); the group's start before any
    hang_timeout_s: float
    judged: bool  # False: a program that has not reported yet (never called hung)
    ranks: tuple[RankPhase, ...] = ()


@dataclass(frozen=True)
class HangDecision:
    reason: str  # the restart's reason: the silence and the phase it happened in


def where(ranks: tuple[RankPhase, ...]) -> RankPhase | None:
    """The rank whose progress the job's phase is named by: the one that advanced last (the lowest rank of
    those), since ranks waiting on it at a collective stopped earlier."""
    return max(ranks, key=lambda r: (r.advanced_s, -r.rank), default=None)


def on_silence(status: HangStatus) -> HangDecision | None:
    """A decision to restart the group as hung, or None while it is progressing (or not judged)."""
    silent_s = status.now_s - status.last_progress_s
    if not status.judged or silent_s <= status.hang_timeout_s:
        return None
    lead = where(status.ranks)
    if lead is None:
        return HangDecision(f"no progress for {status.hang_timeout_s:.0f}s (hang) before any rank reported")
    p = lead.progress
    phase = (f"after step {p.done}" if p.phase == Phase.TRAINING else f"while {p.describe()}")
    return HangDecision(f"no progress for {status.hang_timeout_s:.0f}s (hang) {phase} (rank {lead.rank})")
