"""JobRun: owns one job's run — form a worker group, watch it, apply the policies' decisions.

`trainyard run` drives it in-process; the service runs it inside the per-job supervisor actor
(actor.py). Either way the caller hears about it through a RunListener. The shape follows Ray
Train v2's controller: `_step()` is one poll of the group and returns None (keep going) or the
attempt's Outcome; `_apply()` acts on the Outcome. Every decision comes from a pure policy in
policies/; waiting and sleeping happen only here. What the ranks report at each poll is taken in by
RankIntake (rank_intake.py).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from service.lifecycle import JobState, check_transition
from service.supervisor import excluded_nodes
from service.supervisor.aggregate import StepAggregator
from service.supervisor.attempt import Attempt
from service.supervisor.capacity import wait_for_capacity
from service.supervisor.cluster import Cluster, GroupFactory, RayCluster, free_worker_slots
from service.supervisor.listener import RunListener, SilentListener
from service.supervisor.logfile import supervisor_log
from service.supervisor.lost_trainers import LostTrainers
from service.supervisor.outcome import Outcome, OutcomeKind
from service.supervisor.pipeline_balance import PipelineRebalancer
from service.supervisor.policies.failure import FailureAction, FailureStatus, RestartsUsed, on_failure
from service.supervisor.policies.hang import HangStatus, on_silence
from service.supervisor.policies.preemption import PreemptionAction, PreemptionStatus, on_preemption
from service.supervisor.policies.reshape import CheckpointStatus, on_durable_checkpoint
from service.supervisor.policies.rollback import RollbackStatus, on_restart
from service.supervisor.policies.sizing import GrowthStatus, SizingAction, on_growth
from service.supervisor.program_steps import ProgramStepJoiner
from service.supervisor.progress_watch import ProgressWatch
from service.supervisor.rank_intake import RankIntake, validation_event
from service.supervisor.resume_point import resume_step_riding_outages
from service.supervisor.step_history import StepHistory
from service.supervisor.straggler_response import StragglerResponse
from service.supervisor.stragglers import StragglerWatch
from service.supervisor.summary import final_result, layout_of, run_summary
from service.tracking.listener import tracked
from workers.checkpointing.retry import StoreUnavailable
from workers.events import (
    ExcludedNodesEvent,
    PreemptedEvent,
    ResizeEvent,
    RestartCause,
    RestartEvent,
    RunEvent,
)
from workers.runtime.group import GroupFailure, WorkerGroup
from workers.runtime.group_owner import GroupOwner
from workers.spec import JobSpec
from workers.storage import Storage
from workers.training.recovery import RecoveryState

log = logging.getLogger("trainyard.supervisor")


class JobRun(RankIntake, LostTrainers):
    settle_s = 2.0  # how long freed resources may take to show up after a teardown
    capacity_timeout_s = 120.0  # how long to wait for min_workers before failing
    capacity_poll_s = 0.5
    growth_check_s = 2.0
    survivors_poll_timeout_s = 5.0  # a stopped (SIGSTOPped, hung) rank does not hold up the restart longer

    def __init__(self, spec: JobSpec, job: Storage | str | os.PathLike, job_id: str,
                 listener: RunListener | None = None, poll_interval_s: float = 0.25, start_timeout_s: float = 120.0,
                 group_factory: GroupFactory | None = None, cluster: Cluster | None = None,
                 restarts_before: RestartsUsed = RestartsUsed(), epoch: int = 0):
        # The job's files: a local directory or an object store (checkpoints, ledgers, the export).
        self.spec, self.storage, self.job_id = spec, Storage.of(job), job_id
        self.owner = GroupOwner(job_id, epoch)  # named in every placement group this run creates
        self.current = spec  # the layout running now; differs from `spec` after an elastic resize
        reports = listener or SilentListener()
        # With `tracking`, what the run reports also goes to MLflow / TensorBoard (off this thread).
        self.tracking = tracked(reports, spec, self.storage, job_id)
        self.listener: RunListener = self.tracking or reports
        self.poll_interval_s, self.start_timeout_s = poll_interval_s, start_timeout_s
        self.group_factory: GroupFactory = group_factory or WorkerGroup
        self.cluster: Cluster = cluster or RayCluster()
        self.state = JobState.STARTING
        self.restarts = self.resizes = self.rollbacks = 0  # rollbacks: restarts that rolled back bad steps
        self.used = restarts_before  # the job's restarts by budget, its earlier supervisors' included
        self.lr_scale = 1.0  # learning-rate factor after rollbacks with fault_tolerance.lr_backoff
        self.warm_workers = 0
        self.lost_trainers, self.lost_at = [], {}  # lost_trainers.py
        self.rendezvous: list[tuple[str, int] | None] = []  # TCP store address of every attempt
        self.steps = StepHistory()  # bounded, whatever the run's length (service/supervisor/step_history.py)
        self._notices: list[RunEvent] = []  # the ranks' notices of this poll, merged before they are told
        self.last_checkpoint_step: int | None = None
        self.error: str | None = None
        self.result: dict = {}
        self._cancel, self._preempt = threading.Event(), threading.Event()
        self.preempted_by: str | None = None  # the higher-priority job this run makes room for
        self._live: Attempt | None = None
        self._pipeline_balance = PipelineRebalancer(spec)  # re-split unbalanced pipeline stages (opt-in)
        self.stragglers = StragglerResponse(spec, self.listener, self.cluster)  # its data split, rank moves
        # degraded nodes no rank is placed on again (straggler replace), also by this job's next supervisors
        self.avoid_nodes: set[str] = excluded_nodes.load(self.storage)

    def cancel(self) -> None:
        self._cancel.set()

    def preempt(self, by: str) -> None:
        """Make room for job `by`: every rank stops at its next checkpoint step (written, then the
        run ends QUEUED); a new supervisor resumes from it when the job is admitted again."""
        if not self._preempt.is_set():
            self.preempted_by = by
            self._preempt.set()

    def run(self) -> dict:
        if self.storage.is_local:  # an object store has no directory to make (and the node keeps nothing)
            self.storage.local_path.mkdir(parents=True, exist_ok=True)
        with supervisor_log(self.storage):
            self.listener.on_state(self.state, "forming the worker group")
            if (recovery := RecoveryState.load(self.storage)) is not None:  # a job resumed after rollbacks
                self.lr_scale = recovery.lr_scale
            if self.avoid_nodes:  # an earlier supervisor of this job moved ranks off these nodes
                self.listener.on_event(ExcludedNodesEvent(tuple(sorted(self.avoid_nodes))))
            attempt = 0
            try:
                while self._apply(self._attempt(attempt)):
                    attempt += 1
            except StoreUnavailable as exc:  # the resume point unreadable past TRAINYARD_STORE_RETRY_S
                self._fail(str(exc))
            finally:
                if self.tracking is not None:  # the final validation loss, the exported model, the run's end
                    self.tracking.finish(self.result.get("val_loss"))
            return self.summary()

    # --- the loop: one attempt per worker group, then its outcome applied ---------------------

    def _attempt(self, attempt: int) -> Outcome:
        group = self.group_factory(self.current, self.storage, attempt, self.owner,
                                   frozenset(self.avoid_nodes), self._cancel.is_set)
        self._live = None
        try:
            if self._cancel.is_set():
                return Outcome.cancelled()
            if on_preemption(PreemptionStatus(self._preempt.is_set(), False)) == PreemptionAction.REQUEUE:
                return Outcome.preempted()
            start_step = group.start(self.start_timeout_s, self.stragglers.rank_terms(self.current))[0]["start_step"]
            self.lost_trainers, self.lost_at = [], {}  # a new group: every rank of the layout runs again
            self.rendezvous.append(group.master)
            self.warm_workers = group.warm_workers
            left = (f"resuming after its last step ({start_step}) into the phases left: final checkpoint, "
                    f"validation, export" if self.spec.program is None and start_step >= self.spec.total_steps
                    else f"training from step {start_step}")
            self._set_state(JobState.RUNNING, f"{self.current.world_size} workers ({group.warm_workers} from the "
                                              f"warm pool) {left}")
            self.stragglers.report_move(group, self.avoid_nodes)
            now, ws = time.monotonic(), self.current.world_size
            joiner = (ProgramStepJoiner(ws) if self.spec.program is not None
                      else StepAggregator(ws, self.spec.train.global_batch_size))
            live = self._live = Attempt(group, joiner, StragglerWatch(ws, self.spec.supervisor.straggler), now, now)
            hang = self.spec.fault_tolerance.hang_timeout_s
            live.progress = ProgressWatch(now, self.spec.total_steps, event_after_s=min(10.0, hang / 2),
                                          event_every_s=min(30.0, hang))
            while (outcome := self._step(live)) is None:
                # Poll fast until the first step arrives: time to first step is what users wait on.
                time.sleep(self.poll_interval_s if live.trained else 0.02)
            return outcome
        except GroupFailure as exc:
            self._take_survivors_reports()
            self._record_partial_steps()
            log.warning("attempt %d failed: %s", attempt, exc)
            return Outcome.failed(str(exc), exc.cause, exc.retryable)
        finally:
            group.shutdown()

    def _step(self, live: Attempt) -> Outcome | None:
        """One poll of the running group: None to poll again, else how the attempt ended."""
        if self._cancel.is_set():
            return Outcome.cancelled() if self._stopped(live) else None
        if on_preemption(PreemptionStatus(self._preempt.is_set(), True, live.stop_sent)) == PreemptionAction.ASK_STOP:
            self._ask_stop(live)  # the ranks agree at their next checkpoint step (workers/training/trainer.py)
        if live.stop_deadline_s is not None and time.monotonic() > live.stop_deadline_s:
            return Outcome.preempted()  # a program that did not stop within its grace period
        durable = self._poll(live)
        if durable is not None and (reshape := self._reshape_at(live, durable)) is not None:
            self._poll(live)  # every rank is past the checkpoint: keep their last steps
            self._record_partial_steps()
            return reshape
        finished = live.group.check()
        self._shrink_by_lost(live)
        if finished:
            self._poll(live)
            if any("stopped_at" in (r or {}) for r in live.group.results):  # rank 0's, or a live one's (async PS)
                return Outcome.preempted()
            self.result = final_result(live.group.results)
            if (validation := self.result.get("validation")) is not None:  # what the final validation covered
                self.listener.on_event(validation_event(validation, self.result.get("step") or 0, final=True))
            return Outcome.finished()
        now = time.monotonic()
        # No progress in any phase for hang_timeout_s (a program that never reported can only die, not hang).
        hung = on_silence(HangStatus(now, live.last_progress_s, self.spec.fault_tolerance.hang_timeout_s,
                                     live.trained or self.spec.program is None,
                                     tuple(live.progress.ranks.values()) if live.progress else ()))
        if hung is not None:
            raise GroupFailure(hung.reason, cause=RestartCause.HANG)
        may_grow = self.current.world_size < self.spec.resources.elastic_range[1]  # spares a cluster query
        if may_grow and live.grow_to is None and now - live.last_growth_check_s > self.growth_check_s:
            live.last_growth_check_s = now
            live.grow_to = on_growth(GrowthStatus(self.spec, self.current, self._free_slots()))
            if live.grow_to is not None:
                log.info("room for %d workers (running %d): regrowing at the next checkpoint",
                         live.grow_to.world_size, self.current.world_size)
        return None

    def _ask_stop(self, live: Attempt) -> None:
        live.group.request_stop()
        live.stop_sent = True
        if self.spec.program is not None:
            live.stop_deadline_s = time.monotonic() + self.spec.program.grace_period_s

    def _stopped(self, live: Attempt) -> bool:
        """After a cancel: Trainyard's loop stops at once; a program first sees should_stop() and may
        save, until it returns or its grace period is over."""
        if self.spec.program is None:
            return True
        if not live.stop_sent:
            self._ask_stop(live)
        try:
            self._poll(live)
            done = live.group.check()
        except GroupFailure:
            return True
        return done or time.monotonic() > (live.stop_deadline_s or 0.0)

    def _apply(self, outcome: Outcome) -> bool:
        """Act on how an attempt ended; True to start another."""
        if outcome.kind == OutcomeKind.PREEMPTED:
            event = PreemptedEvent(self.preempted_by, self.steps.last_step,
                                   self._checkpoint_step())
            self.listener.on_event(event)
            self._set_state(JobState.QUEUED, event.message)
            return False
        if outcome.kind in (OutcomeKind.FINISHED, OutcomeKind.CANCELLED):
            done = JobState.SUCCEEDED if outcome.kind == OutcomeKind.FINISHED else JobState.CANCELLED
            self._set_state(done, outcome.reason)
            return False
        if outcome.kind == OutcomeKind.RESIZE:  # regrow, re-split or move from the checkpoint just written
            self._set_state(JobState.RECOVERING, outcome.reason)
            if outcome.spec is not None and outcome.spec is not self.current:
                self._resize(outcome.spec, outcome.reason)
            if outcome.move is not None:
                self.avoid_nodes.add(outcome.move[1])
                excluded_nodes.save(self.storage, self.avoid_nodes)
                self.stragglers.moved = (*outcome.move, self.last_checkpoint_step or 0)
            return True
        return self._restart(outcome)

    def _restart(self, failed: Outcome) -> bool:
        decision = on_failure(FailureStatus(
            reason=failed.reason, used=self.used, limits=self.spec.fault_tolerance,
            steps_done=self.steps.last_step, retryable=failed.retryable, cause=failed.cause,
        ))
        if decision.action == FailureAction.FAIL:
            self._fail(decision.reason)
            return False
        self.restarts += 1
        self.used = self.used.plus(decision.cause)
        resume = self._checkpoint_step()
        self._set_state(JobState.RECOVERING, decision.reason)
        self.listener.on_event(RestartEvent(self.used.total, resume, failed.reason, decision.cause, decision.reason))
        ledger = RecoveryState.load(self.storage) if decision.cause.rolls_back else None
        rollback = on_restart(RollbackStatus(decision.cause, resume, tuple(ledger.rollbacks) if ledger else ()))
        if rollback is not None:  # the rollback the ranks recorded (workers/training/recovery.py)
            self.rollbacks, self.lr_scale = self.rollbacks + 1, rollback.lr_scale
            log.info(rollback.message)
            self.listener.on_event(rollback)
        if not self._fit_to_capacity():
            self._fail(f"fewer than resources.min_workers={self.spec.resources.elastic_range[0]} workers "
                       f"available for {self.capacity_timeout_s:.0f}s")
            return False
        return True

    def _fit_to_capacity(self) -> bool:
        """After a failure: keep the layout if the cluster still fits it, else shrink within the elastic range."""
        decision, free = wait_for_capacity(self.spec, self.current, self._free_slots, self._cancel.is_set,
                                           self.settle_s, self.capacity_timeout_s, self.capacity_poll_s)
        if decision.action == SizingAction.RESIZE and decision.spec is not None:
            self._resize(decision.spec, f"only {free} worker slots available")
        elif decision.action == SizingAction.KEEP:
            log.info("%d worker slots free: keeping %d workers", free, self.current.world_size)
        return decision.action != SizingAction.GIVE_UP

    # --- applying what the group reports ------------------------------------------------------

    def _reshape_at(self, live: Attempt, durable: int) -> Outcome | None:
        resplit = self._pipeline_balance.take(self.current, durable) if live.grow_to is None else None
        if resplit is not None:
            self.listener.on_event(resplit[1])
        return on_durable_checkpoint(CheckpointStatus(durable, resplit[0] if resplit else None,
                                                      resplit[1].message if resplit else "", live.grow_to,
                                                      live.replace))

    # --- the state this run owns --------------------------------------------------------------

    def _checkpoint_step(self) -> int:
        """The step the next attempt resumes from: the newest complete checkpoint (a program's own). The
        store may be down when a rank failed because of it: read it as the ranks write, with retries."""
        return resume_step_riding_outages(self.storage, self.spec.program is not None, self.listener.on_event)

    def _free_slots(self) -> int:
        return free_worker_slots(self.cluster, WorkerGroup.bundle_of(self.current), frozenset(self.avoid_nodes))

    def _resize(self, planned: JobSpec, reason: str) -> None:
        event = ResizeEvent(self.layout(), self.layout(planned), reason)
        self.current, self.stragglers.shares = planned, None  # a new world size starts from an even split
        self.resizes += 1
        log.info("resize %s", event.message)
        self.listener.on_event(event)

    def _fail(self, reason: str) -> None:
        self.error = reason
        self._set_state(JobState.FAILED, reason)

    def _set_state(self, state: JobState, message: str) -> None:
        if state == self.state:
            return
        self.state = check_transition(self.state, state)
        log.info("state %s: %s", state, message)
        self.listener.on_state(state, message)

    def summary(self) -> dict[str, Any]:
        return run_summary(self)

    def tracking_info(self) -> dict[str, Any] | None:
        """The job's MLflow run and TensorBoard directory (its REST view), when it tracks."""
        return self.tracking.info() if self.tracking is not None else None

    def layout(self, spec: JobSpec | None = None) -> dict[str, Any]:
        """`spec`'s layout; by default the running one, less the trainers it lost and trains on without (its
        world size is the job's gauge, trainyard_job_world_size)."""
        if spec is not None or not self.lost_trainers:
            return layout_of(spec or self.current)
        lost = len(self.lost_trainers)
        running = layout_of(self.current)
        return {**running, "world_size": running["world_size"] - lost, "dp": running["dp"] - lost}

    def phase(self) -> dict[str, Any] | None:
        """The running attempt's phase outside its steps (`evaluating 1,200/3,125 batches`), None while it
        trains or between attempts: the job view's `phase` (called from the drain's thread)."""
        live = self._live
        watch = live.progress if live is not None else None
        return watch.phase_view() if watch is not None else None
