"""What a run takes in from its ranks at each poll (JobRun's part: service/supervisor/run.py).

A poll's events become the run's steps (joined across ranks, shown to the straggler watch and the
pipeline re-splitter), checkpoints, share changes and merged notices; once a rank failed, what the
survivors reported is taken in too, so that no step up to the resume point is lost.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from service.supervisor.notices import merged
from workers.events import (
    CheckpointEvent,
    RankCheckpoint,
    RankEvent,
    RankNotice,
    RankProgress,
    RankShares,
    RankStep,
    RunEvent,
    SkippedStepEvent,
    ValidationEvent,
)

if TYPE_CHECKING:
    from service.supervisor.attempt import Attempt
    from service.supervisor.listener import RunListener
    from service.supervisor.pipeline_balance import PipelineRebalancer
    from service.supervisor.step_history import StepHistory
    from service.supervisor.straggler_response import StragglerResponse
    from workers.spec import JobSpec


class RankIntake:
    """JobRun's intake of its ranks' reports; the attributes are JobRun's (set in its __init__)."""

    survivors_poll_timeout_s: float
    listener: RunListener
    current: JobSpec
    steps: StepHistory
    stragglers: StragglerResponse
    avoid_nodes: set[str]
    last_checkpoint_step: int | None
    _live: Attempt | None
    _notices: list[RunEvent]
    _pipeline_balance: PipelineRebalancer

    def _poll(self, live: Attempt) -> int | None:
        """Take in what the ranks reported since the last poll; the step of a new durable checkpoint, if any."""
        durable = None
        for event in live.group.poll():
            now = time.monotonic()
            if live.progress is not None and live.progress.observe(event, now):
                live.last_progress_s = now  # a step, or a phase outside the steps advancing
            if isinstance(event, RankStep):
                live.trained = True
            self._handle(live, event)
            if isinstance(event, RankCheckpoint) and event.rank == self._reporting_rank(live):
                durable = event.step
        for phase in live.progress.phase_events(time.monotonic()) if live.progress is not None else ():
            self.listener.on_event(phase)  # a long validation, upload or export, named with its progress
        self._tell_notices()
        return durable

    def _handle(self, live: Attempt, event: RankEvent) -> None:
        if isinstance(event, RankStep):
            joined = live.aggregator.add(event.record)
            if joined is not None:
                for change in live.stragglers.observe(joined):
                    self.stragglers.on_change(live, change, self.current, self.avoid_nodes)
                self._pipeline_balance.observe(self.current, joined)
                self._append_step(joined)
        elif isinstance(event, RankNotice):  # each rank's own (its store retries): told once per cause, below
            self._notices.append(event.event)
        elif isinstance(event, RankProgress):  # taken in by the attempt's ProgressWatch (_poll)
            return
        elif event.rank != self._reporting_rank(live):  # every rank reports the same checkpoint or split: one's
            return
        elif isinstance(event, RankCheckpoint):
            self.last_checkpoint_step = event.step
            self.listener.on_event(CheckpointEvent(event.step, event.duration_s))
        elif isinstance(event, RankShares):  # the ranks switched to a rebalanced split
            self.stragglers.on_shares(live, event, self.current)

    @staticmethod
    def _reporting_rank(live: Attempt) -> int:
        """The rank whose checkpoint reports are the job's: rank 0, or the lowest live one once rank 0 was lost
        (the parameter server's async trainers, whose lead then writes the checkpoints)."""
        lost = getattr(live.group, "lost", None) or {}
        return next(r for r in range(len(lost) + 1) if r not in lost)

    def _tell_notices(self) -> None:
        for event in merged(self._notices):  # one event per cause, however many ranks saw it
            self.listener.on_event(event)
        self._notices = []

    def _take_survivors_reports(self) -> None:
        """Once a rank failed, what the others reported since the last poll: steps up to the checkpoint the
        next attempt resumes from are not trained again, so a record left unpolled here is lost for good."""
        if self._live is not None:
            for event in self._live.group.poll(self.survivors_poll_timeout_s):
                if not isinstance(event, RankStep):
                    self._handle(self._live, event)
                elif (joined := self._live.aggregator.add(event.record)) is not None:
                    self._append_step(joined)  # not shown to the straggler watch: this group is over
            self._tell_notices()

    def _record_partial_steps(self) -> None:
        # Ranks that died took their last records with them; keep what the survivors reported.
        if self._live is not None:
            for record in self._live.aggregator.flush():
                self._append_step(record)

    def _append_step(self, record: dict) -> None:
        if record.get("skipped") and not record.get("partial"):
            self.listener.on_event(SkippedStepEvent(record["step"], record["loss"],
                                                    record.get("skip_reason") or "non_finite"))
        if (validation := record.get("validation")) is not None:  # an eval_every validation and its coverage
            self.listener.on_event(validation_event(validation, record["step"], final=False))
        self.steps.append(record)  # a step replayed after a restart replaces what followed it
        self.listener.on_step(record)


def validation_event(validation: dict, step: int, final: bool) -> ValidationEvent:
    """A rank's validation figures (workers/training/validation.py Validation, as a dict) as an event."""
    return ValidationEvent(step, validation["loss"], validation["samples"], validation["batches"],
                           validation["batch_size"], validation.get("split_samples"), final)
