"""A rank's progress outside its steps, sent to the supervisor as typed values (workers/phases.py Progress).

The supervisor's hang timer restarts on progress, whatever the phase (service/supervisor/policies/hang.py),
so every phase a rank can spend long in reports through one `ProgressReporter`: validation (batches),
checkpoint saves and uploads (bytes), the export and the set-up (stages), the first step (micro-batches).
Reports are throttled to one per `interval_s` per phase, a phase's first and last always sent: a
validation of 12,500 batches sends a few dozen messages, not 12,500, and the supervisor still hears
from it well inside any hang timeout (the interval is a sixth of it, at most 1 s).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from workers.events import RankEvent, RankProgress
from workers.phases import Phase, Progress

T = TypeVar("T")


def report_interval_s(hang_timeout_s: float) -> float:
    return min(1.0, hang_timeout_s / 6)


class ProgressReporter:
    """Sends one rank's Progress to `emit`; before `emit` is set (the set-up, in some paths) it keeps the
    latest report per phase and sends them once it is."""

    def __init__(self, rank: int, interval_s: float, emit: Callable[[RankEvent], None] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.rank, self.interval_s, self.clock = rank, interval_s, clock
        self._emit = emit
        self._held: list[Progress] = []
        self._last: Progress | None = None
        self._last_sent_s = -float("inf")

    def attach(self, emit: Callable[[RankEvent], None]) -> None:
        self._emit = emit
        held, self._held = self._held, []
        for progress in held:
            emit(RankProgress(self.rank, progress))

    def report(self, progress: Progress) -> None:
        last = self._last
        new_phase = last is None or last.key != progress.key
        finished = progress.total is not None and progress.done >= progress.total
        now = self.clock()
        if not (new_phase or finished or now - self._last_sent_s >= self.interval_s):
            return
        if last is not None and not new_phase and progress.done <= last.done:
            return  # nothing new to say: the supervisor counts only advancing reports as progress
        self._last, self._last_sent_s = progress, now
        if self._emit is None:
            self._held = [p for p in self._held if p.key != progress.key] + [progress]
        else:
            self._emit(RankProgress(self.rank, progress))

    def note(self, progress: Progress) -> None:
        """Progress the supervisor hears some other way (a step: RankStep), kept only as where the rank is."""
        self._last = progress

    @property
    def last(self) -> Progress | None:
        """Where the rank is: its latest progress (an out-of-memory error names it)."""
        return self._last

    def phase(self, phase: Phase, total: int | None = None, step: int = 0, what: str = "") -> PhaseMeter:
        """A meter of one phase, reported at once (entering a phase is progress)."""
        meter = PhaseMeter(self, Progress(phase, 0, total, step, what))
        self.report(meter.progress)
        return meter


class PhaseMeter:
    def __init__(self, reporter: ProgressReporter, progress: Progress):
        self.reporter, self.progress = reporter, progress

    def update(self, done: int, total: int | None = None) -> None:
        p = self.progress
        self.progress = Progress(p.phase, done, p.total if total is None else total, p.step, p.what)
        self.reporter.report(self.progress)

    def advance(self, n: int = 1) -> None:
        self.update(self.progress.done + n)

    def counting(self, items: Iterator[T]) -> Iterator[T]:
        """`items`, advancing once per item after it is consumed."""
        for item in items:
            yield item
            self.advance()


class CountedList(list):
    """A step's micro-batches that count themselves as a strategy iterates them (the first step's
    progress: its set-up happens inside the strategy's forward/backward, micro-batch by micro-batch)."""

    def __init__(self, items: list, meter: PhaseMeter):
        super().__init__(items)
        self.meter = meter

    def __iter__(self):
        for i, item in enumerate(super().__iter__()):
            self.meter.update(i)
            yield item
        self.meter.update(len(self))
