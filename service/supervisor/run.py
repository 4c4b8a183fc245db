"""JobRun: owns one job's run on Ray — form the group, watch it, restart it, finish it.

`trainyard run` drives it in-process; the service runs it inside the per-job
supervisor actor. Either way the caller hears about it through a RunListener.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from service.lifecycle import JobState, check_transition
from service.supervisor import excluded_nodes
from service.supervisor.aggregate import StepAggregator
from service.supervisor.elastic import (
    best_layout,
    free_slots_per_node,
    free_worker_slots,
)
from service.supervisor.pipeline_balance import PipelineRebalancer
from service.supervisor.policies import Action, FailureStatus, on_failure
from service.supervisor.replacement import ReplaceStatus, on_slow_rank, slots_off
from service.supervisor.stragglers import (
    StragglerChange,
    StragglerDetector,
    even_shares,
    rebalanced_shares,
)
from workers.checkpointing import latest_checkpoint
from workers.parallel import strategy_name
from workers.parallel.pipeline.bubble import pipeline_summary
from workers.runtime.group import GroupFailure, WorkerGroup
from workers.spec import JobSpec
from workers.training.recovery import RecoveryState

log = logging.getLogger("trainyard.supervisor")


class RunListener(Protocol):
    def on_state(self, state: JobState, message: str) -> None: ...
    def on_event(self, kind: str, message: str, data: dict) -> None: ...
    def on_step(self, record: dict) -> None: ...


class _Silent:
    def on_state(self, state, message): pass
    def on_event(self, kind, message, data): pass
    def on_step(self, record): pass


@dataclass(frozen=True)
class Resize:
    """Restart the group at the next durable checkpoint with another layout or placement."""

    spec: JobSpec
    reason: str
    move: tuple[int, str] | None = None  # (rank, node): restart with that node excluded (straggler replace)


PREEMPTED = "preempted"  # an attempt's outcome: every rank stopped at a checkpoint step, asked to


class JobRun:
    settle_s = 2.0  # how long freed resources may take to show up after a teardown
    capacity_timeout_s = 120.0  # how long to wait for min_workers before failing
    growth_check_s = 2.0

    def __init__(self, spec: JobSpec, job_dir: Path, job_id: str, listener: RunListener | None = None,
                 poll_interval_s: float = 0.25, start_timeout_s: float = 120.0):
        self.spec, self.job_dir, self.job_id = spec, Path(job_dir), job_id
        self.current = spec  # the layout running now; differs from `spec` after an elastic resize
        self.resizes = 0
        self.listener = listener or _Silent()
        self.poll_interval_s, self.start_timeout_s = poll_interval_s, start_timeout_s
        self.state = JobState.STARTING
        self.restarts = 0
        self.rollbacks = 0  # restarts that rolled back bad steps (non-finite or loss spikes)
        self.lr_scale = 1.0  # learning-rate factor after rollbacks with fault_tolerance.lr_backoff
        self.warm_workers = 0
        self.rendezvous: list[tuple[str, int]] = []  # TCP store address of every attempt
        self.steps: list[dict] = []
        self.last_checkpoint_step: int | None = None
        self.error: str | None = None
        self.result: dict = {}
        self._cancel = threading.Event()
        self._preempt = threading.Event()
        self.preempted_by: str | None = None  # the higher-priority job this run makes room for
        self._group: WorkerGroup | None = None
        self._aggregator: StepAggregator | None = None
        self._stragglers: StragglerDetector | None = None
        self._per_sample: list[deque] = []
        self._shares_version = 0  # of the last data split asked of the ranks (workers/training/control.py)
        self._shares_pending: list[int] | None = None  # asked, not yet agreed by the ranks
        self._judge_from_step = 0  # straggler scores count from here (after a live rebalance)
        self._pipeline_balance = PipelineRebalancer(spec)  # re-split unbalanced pipeline stages (opt-in)
        self.shares: list[int] | None = None  # uneven data split after a straggler rebalance; kept on restarts
        # degraded nodes no rank is placed on again (straggler replace), also by this job's next supervisors
        self.avoid_nodes: set[str] = excluded_nodes.load(self.job_dir)
        self._replace: tuple[int, str] | None = None  # (rank, node) to move at the next checkpoint
        self._moved: tuple[int, str, int] | None = None  # (rank, from node, step) for the next group to report
        self._last_replace_step: int | None = None

    # --- public ------------------------------------------------------------

    def cancel(self) -> None:
        self._cancel.set()

    def preempt(self, by: str) -> None:
        """Make room for job `by`: every rank stops at its next checkpoint step (written, then the
        run ends QUEUED); a new supervisor resumes from it when the job is admitted again."""
        if not self._preempt.is_set():
            self.preempted_by = by
            self._preempt.set()

    def run(self) -> dict:
        self.job_dir.mkdir(parents=True, exist_ok=True)
        handler = _attach_log_file(self.job_dir / "logs" / "supervisor.log")
        try:
            return self._run()
        finally:
            log.removeHandler(handler)
            handler.close()

    def _run(self) -> dict:
        self.listener.on_state(self.state, "forming the worker group")
        if (recovery := RecoveryState.load(self.job_dir)) is not None:  # a job resumed after rollbacks
            self.lr_scale = recovery.lr_scale
        if self.avoid_nodes:  # an earlier supervisor of this job moved ranks off these nodes
            self.listener.on_event("excluded_nodes", f"ranks stay off {len(self.avoid_nodes)} degraded node(s) "
                                   "an earlier supervisor moved them from", {"nodes": sorted(self.avoid_nodes)})
        attempt = 0
        while True:
            outcome = self._attempt(attempt)
            attempt += 1
            if outcome == PREEMPTED:
                self._requeue()
                break
            if outcome in (JobState.SUCCEEDED, JobState.CANCELLED):
                self._set_state(outcome, "training finished" if outcome == JobState.SUCCEEDED else "cancelled by user")
                break
            if isinstance(outcome, Resize):  # regrow, re-split or move from the checkpoint just written
                self._set_state(JobState.RECOVERING, outcome.reason)
                if outcome.spec is not self.current:
                    self._resize(outcome.spec, outcome.reason)
                if outcome.move is not None:
                    self.avoid_nodes.add(outcome.move[1])
                    excluded_nodes.save(self.job_dir, self.avoid_nodes)
                    self._moved = (*outcome.move, self.last_checkpoint_step or 0)
                continue
            reason, retryable = outcome
            decision = on_failure(FailureStatus(
                reason=reason, restarts_done=self.restarts, max_restarts=self.spec.fault_tolerance.max_restarts,
                steps_done=self.steps[-1]["step"] if self.steps else 0, retryable=retryable,
            ))
            if decision.action == Action.FAIL:
                self._fail(decision.reason)
                break
            self.restarts += 1
            latest = latest_checkpoint(self.job_dir)
            self._set_state(JobState.RECOVERING, decision.reason)
            cause = failure_cause(reason)
            self.listener.on_event("restart", decision.reason, {
                "restart": self.restarts, "resume_step": latest[0] if latest else 0, "reason": reason,
                "cause": cause,
            })
            if cause == "non_finite":
                self._report_rollback(latest[0] if latest else 0)
            if not self._fit_to_capacity():
                self._fail(f"fewer than resources.min_workers={self.spec.resources.elastic_range[0]} workers "
                           f"available for {self.capacity_timeout_s:.0f}s")
                break
        return self.summary()

    def _requeue(self) -> None:
        latest = latest_checkpoint(self.job_dir)
        step, resume = (self.steps[-1]["step"] if self.steps else 0), (latest[0] if latest else 0)
        message = f"preempted by job {self.preempted_by} at step {step}; resumes from the checkpoint at step {resume}"
        self.listener.on_event("preempted", message, {"by": self.preempted_by, "step": step, "checkpoint_step": resume})
        self._set_state(JobState.QUEUED, message)

    def _fail(self, reason: str) -> None:
        self.error = reason
        self._set_state(JobState.FAILED, reason)

    def _report_rollback(self, resume_step: int) -> None:
        """The rollback the ranks recorded (workers/training/recovery.py) as an event: bad steps, the step
        resumed from, the data window skipped and the learning-rate factor from now on."""
        state = RecoveryState.load(self.job_dir)
        if state is None or not state.rollbacks:
            return
        last = state.rollbacks[-1]
        first, step = last["bad_steps"]
        window = last["data_window"]
        what = "non-finite gradients" if last["reason"] == "non_finite" else "loss spikes"
        message = (f"rollback from step {step} to step {resume_step}: steps {first}..{step} had {what}; "
                   + (f"data batches [{window[0]}, {window[1]}) skipped" if window else "no data skipped")
                   + f"; learning rate x{last['lr_scale']:g}")
        self.rollbacks += 1
        self.lr_scale = last["lr_scale"]
        log.info(message)
        self.listener.on_event("rollback", message, {
            "from_step": step, "to_step": resume_step, "skipped_steps": [first, step], "reason": last["reason"],
            "data_window": window, "lr_scale": last["lr_scale"], "rollback": len(state.rollbacks),
        })

    # --- elasticity --------------------------------------------------------

    def _fit_to_capacity(self) -> bool:
        """After a failure: keep the layout if the cluster still fits it, else shrink within the elastic range."""
        started = time.monotonic()
        bundle = WorkerGroup.bundle_of(self.current)
        while not self._cancel.is_set():
            capacity = free_worker_slots(bundle, frozenset(self.avoid_nodes))
            if capacity >= self.current.world_size:
                log.info("%d worker slots free: keeping %d workers", capacity, self.current.world_size)
                return True
            waited = time.monotonic() - started
            # Resources of the group just torn down take a moment to return; only then shrink.
            if waited > self.settle_s:
                planned = best_layout(self.spec, capacity)
                if planned is not None:
                    self._resize(planned, f"only {capacity} worker slots available")
                    return True
            if waited > self.capacity_timeout_s:
                return False
            time.sleep(0.5)
        return True  # cancelled: the next attempt notices

    def _growth(self) -> JobSpec | None:
        """A larger layout than the current one, if the job may grow and the cluster has room."""
        if self.current.world_size >= self.spec.resources.elastic_range[1]:
            return None
        capacity = free_worker_slots(WorkerGroup.bundle_of(self.current), frozenset(self.avoid_nodes)) \
            + self.current.world_size
        planned = best_layout(self.spec, capacity)
        if planned is None or planned.world_size <= self.current.world_size:
            return None
        log.info("room for %d workers (running %d): regrowing at the next checkpoint",
                 planned.world_size, self.current.world_size)
        return planned

    def _resize(self, planned: JobSpec, reason: str) -> None:
        before, after = self.layout(), self.layout(planned)
        self.current = planned
        self.shares = None  # a new world size starts from an even split
        self.resizes += 1
        log.info("resize %d -> %d workers (%s)", before["world_size"], after["world_size"], reason)
        self.listener.on_event("resize", f"{before['world_size']} -> {after['world_size']} workers: {reason}", {
            "from": before, "to": after, "reason": reason,
        })

    # --- one attempt -------------------------------------------------------

    def _attempt(self, attempt: int) -> "JobState | Resize | tuple[str, bool]":
        """Run one worker group to its end: a terminal state, a resize, or (failure reason, retryable)."""
        group = self._group = WorkerGroup(self.current, self.job_dir, attempt, f"ty-{self.job_id}",
                                          frozenset(self.avoid_nodes))
        try:
            if self._cancel.is_set():
                return JobState.CANCELLED
            if self._preempt.is_set():
                return PREEMPTED
            setups = group.start(self.start_timeout_s, self.shares)
            self.rendezvous.append(group.master)
            start_step = setups[0]["start_step"]
            self.warm_workers = group.warm_workers
            self._set_state(JobState.RUNNING, f"{self.current.world_size} workers ({group.warm_workers} from the "
                                              f"warm pool) training from step {start_step}")
            self._report_move(group)
            return self._watch(group)
        except GroupFailure as exc:
            self._record_partial_steps()
            log.warning("attempt %d failed: %s", attempt, exc)
            return str(exc), exc.retryable
        finally:
            group.shutdown()
            self._group = None

    def _record_partial_steps(self) -> None:
        # Ranks that died took their last records with them; keep what the survivors reported.
        if self._aggregator is not None:
            for record in self._aggregator.flush():
                self._append_step(record)

    def _watch(self, group: WorkerGroup) -> "JobState | Resize":
        aggregator = self._aggregator = StepAggregator(self.current.world_size, self.spec.train.global_batch_size)
        self._stragglers = StragglerDetector(self.current.world_size, self.spec.supervisor.straggler)
        self._per_sample = [deque(maxlen=self.spec.supervisor.straggler.window) for _ in range(self.current.world_size)]
        self._shares_pending, self._judge_from_step = None, 0  # a new group never heard of a request
        self._replace = None
        last_progress = last_growth_check = time.monotonic()
        hang_timeout = self.spec.fault_tolerance.hang_timeout_s
        grow_to: JobSpec | None = None
        trained = stop_sent = False
        while True:
            if self._cancel.is_set():
                return JobState.CANCELLED
            if self._preempt.is_set() and not stop_sent:
                group.request_stop()  # the ranks agree at their next checkpoint step (workers/training/trainer.py)
                stop_sent = True
            durable = None
            for event in group.poll():
                if self._handle(event, aggregator):
                    last_progress = time.monotonic()
                    trained = True
                elif event.get("kind") == "checkpoint" and event.get("rank") == 0:
                    durable = event["step"]
            reshape = self._reshape_at(durable, grow_to)
            if reshape is not None:
                for event in group.poll():  # every rank is past the checkpoint: keep their last steps
                    self._handle(event, aggregator)
                self._record_partial_steps()
                return reshape
            if group.check():
                for event in group.poll():
                    self._handle(event, aggregator)
                if "stopped_at" in group.results[0]:
                    return PREEMPTED
                self.result = dict(group.results[0])
                self.result["val_loss"] = statistics.fmean(r["val_loss"] for r in group.results)
                return JobState.SUCCEEDED
            now = time.monotonic()
            if now - last_progress > hang_timeout:
                raise GroupFailure(f"no step finished for {hang_timeout:.0f}s (hang)")
            if grow_to is None and now - last_growth_check > self.growth_check_s:
                last_growth_check = now
                grow_to = self._growth()
            # Poll fast until the first step arrives: time to first step is what users wait on.
            time.sleep(self.poll_interval_s if trained else 0.02)

    def _handle(self, event: dict, aggregator: StepAggregator) -> bool:
        kind = event.get("kind")
        if kind == "step":
            joined = aggregator.add(event)
            if joined is not None:
                self._watch_stragglers(joined)
                self._pipeline_balance.observe(self.current, joined)
                self._append_step(joined)
            return True
        if kind == "checkpoint" and event.get("rank") == 0:
            self.last_checkpoint_step = event["step"]
            self.listener.on_event("checkpoint", f"checkpoint at step {event['step']}",
                                   {"step": event["step"], "duration_s": event.get("duration_s")})
        if kind == "shares" and event.get("rank") == 0:
            self._rebalanced(event["shares"], event["step"])
        return False

    def _reshape_at(self, durable: int | None, grow_to: JobSpec | None) -> Resize | None:
        """At a durable checkpoint, the pending regrow (first) or rebalance, if any."""
        if durable is None:
            return None
        resplit = self._pipeline_balance.take(self.current, durable) if grow_to is None else None
        if resplit is not None:
            spec, reason, data = resplit
            self.listener.on_event("pipeline_rebalance", reason, data)
            return Resize(spec, reason)
        if grow_to is not None:
            return Resize(grow_to, f"capacity for {grow_to.world_size} workers returned; "
                                   f"regrowing from the checkpoint at step {durable}")
        if self._replace is not None:
            rank, node = self._replace
            return Resize(self.current, f"moving straggler rank {rank} off node {node[:12]} from the "
                                        f"checkpoint at step {durable}", move=(rank, node))
        return None

    # --- stragglers -----------------------------------------------------------

    def _watch_stragglers(self, record: dict) -> None:
        config = self.spec.supervisor.straggler
        if config.policy == "off" or self._stragglers is None:
            return
        ranks = record["ranks"]
        if record["step"] <= self._judge_from_step:
            return  # trained on the data split before the last rebalance
        changes = self._stragglers.observe(record["step"], [r["compute_time_s"] for r in ranks])
        scores = self._stragglers.scores()
        for r in ranks:
            r["straggler_score"] = scores.get(r["rank"])
        for per_sample, r in zip(self._per_sample, ranks):
            per_sample.append(r["compute_time_s"] / max(r["samples"], 1))
        for change in changes:
            self._on_straggler(change)

    def _on_straggler(self, change: StragglerChange) -> None:
        policy = self.spec.supervisor.straggler.policy
        if not change.slow:
            self.listener.on_event("straggler_recovered", f"rank {change.rank} recovered (score {change.score:.2f})",
                                   {"rank": change.rank, "score": change.score, "step": change.step})
            return
        action = "reported"
        if policy == "rebalance":
            action = self._plan_rebalance()
        elif policy == "replace":
            action = self._plan_replace(change)
        log.info("straggler: rank %d score %.2f at step %d: %s", change.rank, change.score, change.step, action)
        self.listener.on_event("straggler", f"rank {change.rank} is slow (score {change.score:.2f}): {action}", {
            "rank": change.rank, "score": change.score, "step": change.step, "policy": policy, "action": action,
        })

    def _plan_rebalance(self) -> str:
        """Ask the running ranks for a data split that follows their measured speed: they switch
        together at their next agreement step, without a restart (workers/training/control.py)."""
        if self.current.dp < 2 or self._group is None:  # the spec refuses tp, pp, SDP and local SGD
            return "reported (no data-parallel peers to take work)"
        if self._shares_pending is not None:
            return f"reported (the split {self._shares_pending} is about to apply)"
        # Per-sample compute over the window that flagged the rank: mostly, by the median, the slow regime.
        shares = rebalanced_shares(self.spec.train.global_batch_size,
                                   [statistics.median(t) for t in self._per_sample])
        current = self._current_shares()
        if shares == current:
            return f"reported (the split {current} already follows the measured speed)"
        self._shares_version += 1
        self._shares_pending = shares
        self._group.request_shares(self._shares_version, shares)
        return f"rebalancing the global batch from {current} to {shares} at the next agreement step"

    def _current_shares(self) -> list[int]:
        return self.shares or even_shares(self.spec.train.global_batch_size, self.current.dp)

    def _rebalanced(self, shares: list[int], step: int) -> None:
        """The ranks switched to `shares` after `step`: judge every rank afresh on the new split."""
        before = self._current_shares()
        self.shares, self._shares_pending, self._judge_from_step = shares, None, step
        self._stragglers = StragglerDetector(self.current.world_size, self.spec.supervisor.straggler)
        for window in self._per_sample:
            window.clear()
        message = f"global batch rebalanced from {before} to {shares} after step {step}, without a restart"
        log.info(message)
        self.listener.on_event("rebalance", message, {"shares": shares, "from": before, "step": step})

    def _plan_replace(self, change: StragglerChange) -> str:
        """Decide (replacement.py) whether to move the slow rank off its node at the next checkpoint."""
        group, config = self._group, self.spec.supervisor.straggler
        if group is None or not group.nodes:
            return "reported (placement unknown)"
        node = group.nodes[change.rank]
        decision = on_slow_rank(ReplaceStatus(
            rank=change.rank, node=node, step=change.step, world_size=self.current.world_size,
            slots_elsewhere=slots_off(group.nodes, free_slots_per_node(group.bundle()), self.avoid_nodes | {node}),
            last_replace_step=self._last_replace_step, cooldown=config.cooldown or 2 * config.window,
            pending=self._replace is not None,
        ))
        if decision.replace:
            self._replace = (change.rank, node)
        return decision.action

    def _report_move(self, group: WorkerGroup) -> None:
        """After a replacement: say which rank moved from which node to which."""
        if self._moved is None:
            return
        rank, before, step = self._moved
        self._moved, self._last_replace_step = None, step
        after = group.nodes[rank] if rank < len(group.nodes) else None
        message = f"rank {rank} moved from node {before[:12]} to node {(after or '?')[:12]} at step {step}"
        log.info("replace: %s", message)
        self.listener.on_event("replace", message, {
            "rank": rank, "from_node": before, "to_node": after, "step": step, "nodes": list(group.nodes),
            "excluded_nodes": sorted(self.avoid_nodes),
        })

    def _append_step(self, record: dict) -> None:
        if record.get("skipped") and not record.get("partial"):
            reason = record.get("skip_reason") or "non_finite"
            what = SKIP_REASONS.get(reason, reason)
            self.listener.on_event("skipped_step", f"step {record['step']}: {what}, update skipped",
                                   {"step": record["step"], "loss": record["loss"], "reason": reason})
        self.steps = [s for s in self.steps if s["step"] < record["step"]]  # replayed after a restart
        self.steps.append(record)
        self.listener.on_step(record)

    def _set_state(self, state: JobState, message: str) -> None:
        if state == self.state:
            return
        self.state = check_transition(self.state, state)
        log.info("state %s: %s", state, message)
        self.listener.on_state(state, message)

    # --- summary -----------------------------------------------------------

    def summary(self) -> dict:
        steps = self.steps
        steady = steps[len(steps) // 5:] or steps  # skip warm-up steps for throughput
        step_time = sum(s["step_time_s"] for s in steady)
        pipeline = pipeline_summary(self.current, steady)  # the split in use at the end
        g = self.spec.train.global_batch_size
        return {
            "job_id": self.job_id,
            "name": self.spec.name,
            "state": str(self.state),
            "steps": steps[-1]["step"] if steps else 0,
            "initial_loss": steps[0]["loss"] if steps else None,
            "final_loss": steps[-1]["loss"] if steps else None,
            "final_val_loss": self.result.get("val_loss"),
            "world_size": self.current.world_size,
            "layout": self.layout(),
            "samples_per_s": g * len(steady) / step_time if step_time else None,
            # Steps joined from only some ranks (kept across a restart or resize) may lack the tokens.
            "tokens_per_s": statistics.fmean(t) if (t := [s["tokens_per_s"] for s in steady if s.get("tokens_per_s")]) else None,
            "bubble_fraction": pipeline["bubble_fraction"] if pipeline else None,
            "bubble_fraction_theoretical": pipeline["bubble_fraction_theoretical"] if pipeline else None,
            "pipeline": pipeline,  # schedule, split with costs, per-stage bubble and activations (pp > 1)
            "model_state_bytes_per_rank": self.result.get("model_state_bytes"),
            "comm_bytes_per_step": statistics.median(s["comm_bytes"] for s in steps) if steps else None,
            "restarts": self.restarts,
            "resizes": self.resizes,
            "rollbacks": self.rollbacks,
            "lr_scale": self.lr_scale,
            "warm_workers": self.warm_workers,
            "last_checkpoint_step": self.last_checkpoint_step,
            "params_sha256": self.result.get("params_sha256"),
            "sdp": self.result.get("sdp"),  # parallel.sdp: mode, masking, coverage, spectral_gap, held fractions
            "export_path": self.result.get("export_path"),
            "hf_export_path": self.result.get("hf_export_path"),  # an hf job: its save_pretrained directory
            "job_dir": str(self.job_dir),
            "error": self.error,
        }

    def layout(self, spec: JobSpec | None = None) -> dict:
        spec = spec or self.current
        p = spec.parallel
        return {"dp": spec.dp, "tp": p.tp, "pp": p.pp, "zero": p.zero, "strategy": strategy_name(spec),
                "world_size": spec.world_size}


SKIP_REASONS = {"non_finite": "non-finite gradients", "loss_spike": "loss spike",
                "fp16_overflow": "fp16 overflow (loss scale halved)"}


def failure_cause(reason: str) -> str:
    """A short name for why a group failed, for events and metrics labels."""
    for marker, cause in (("NonFiniteTraining", "non_finite"), ("SilentDataCorruption", "corruption"),
                          ("(hang)", "hang"), ("timed out", "hang"), ("ActorDiedError", "worker_lost"),
                          ("did not form", "start")):
        if marker in reason:
            return cause
    return "error"


def _attach_log_file(path: Path) -> logging.Handler:
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    return handler
