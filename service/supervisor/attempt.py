"""What the run loop keeps about the worker group it is watching: nothing of it outlives the group."""

from __future__ import annotations

from dataclasses import dataclass

from service.supervisor.aggregate import StepAggregator
from service.supervisor.cluster import Group
from service.supervisor.progress_watch import ProgressWatch
from service.supervisor.stragglers import StragglerWatch
from workers.spec import JobSpec


@dataclass
class Attempt:
    group: Group
    aggregator: StepAggregator
    stragglers: StragglerWatch
    last_progress_s: float  # monotonic time of the last progress: a step, or a phase advancing (the hang timer)
    last_growth_check_s: float
    shares_pending: tuple[int, ...] | None = None  # a data split asked of the ranks, not yet applied
    replace: tuple[int, str] | None = None  # (rank, node) to move off at the next durable checkpoint
    grow_to: JobSpec | None = None  # a larger layout to regrow to at the next durable checkpoint
    trained: bool = False  # a step arrived (poll slower from then on)
    stop_sent: bool = False  # the ranks were asked to stop (preemption)
    stop_deadline_s: float | None = None  # a program asked to stop is killed after its grace period
    progress: ProgressWatch | None = None  # each rank's phase and progress (the hang timer's input)
