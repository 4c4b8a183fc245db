"""Reconciler: copies what supervisors report into the database and recovers lost ones.

Each tick, for every STARTING/RUNNING/RECOVERING job:
- its supervisor (found by name, so a restarted control plane re-attaches) is
  drained; state changes go through the lifecycle table and become events,
  steps become (downsampled) metrics, checkpoints become rows; the records'
  sequence number is stored in the same transaction and acknowledged on the
  next drain, so nothing is lost or stored twice;
- a job whose supervisor is gone is restarted with a new supervisor on the
  same job directory, which resumes from the latest checkpoint (or cancelled,
  if a cancel was pending). No accepted job is dropped.

With several control-plane replicas only the lease holder reconciles, and its
sessions are fenced (service/leases.py): a replica that lost the lease cannot
store a drain or restart a job, and does not start a supervisor after its
commit, so a job is never restarted twice. `supervisor_epoch` fences the
supervisors themselves: a drain from an older epoch is ignored.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import ray
from ray.actor import ActorHandle
from sqlalchemy.orm import Session

from service import preemption
from service.db import repository as repo
from service.db.engine import SessionSource
from service.lifecycle import TERMINAL, IllegalTransition, JobState
from service.live_metrics import LiveMetrics
from service.restart_history import restarts_used
from service.settings import Settings
from service.supervisor.actor import find_supervisor
from service.supervisor.launch import Launcher
from service.supervisor.policies.failure import FailureAction, FailureStatus, on_failure
from service.supervisor.resume_point import resume_step
from workers.checkpointing import checkpoint_root, step_name
from workers.events import CheckpointEvent, RestartCause, RestartEvent
from workers.spec import FaultToleranceSpec
from workers.storage import Storage, client_env

log = logging.getLogger("trainyard.reconciler")
DRAIN_TIMEOUT_S = 10.0


class Reconciler:
    def __init__(self, sessions: SessionSource, settings: Settings, launcher: Launcher | None = None,
                 metrics: LiveMetrics | None = None):
        self.sessions, self.settings = sessions, settings
        self.launcher = launcher or Launcher(settings)
        self.metrics = metrics or LiveMetrics(retention_s=settings.metrics_retention_s)
        self.handles: dict[str, ActorHandle] = {}  # job id -> supervisor actor handle

    def _leading(self) -> bool:
        """Still the lease holder (always, with plain sessions: one replica)."""
        return getattr(self.sessions, "still_leading", lambda: True)()

    def tick(self) -> None:
        with self.sessions() as s:
            active = repo.active_jobs(s)
            jobs = [(j.id, j.drained_seq, j.cancel_requested, j.supervisor_name) for j in active]
            epochs = {j.id: j.supervisor_epoch for j in active}
            preempts = preemption.pending(s, active)  # asked by the scheduler, resent until requeued
        refs = {}
        for job_id, ack, cancel, name in jobs:
            handle = self.handles.get(job_id)
            if handle is None:
                handle = find_supervisor(name)
                if handle is None:
                    self.recover(job_id)
                    continue
                self.handles[job_id] = handle
                self._note_reattach(job_id)
            if cancel:
                handle.cancel.remote()
            elif job_id in preempts:
                handle.preempt.remote(preempts[job_id], epochs[job_id])
            refs[job_id] = handle.drain.remote(ack)
        for job_id, ref in refs.items():
            try:
                drained = ray.get(ref, timeout=DRAIN_TIMEOUT_S)
                if not drained["started"]:  # admitted, but the control plane died before handing it the job
                    self._hand_over(job_id)
                    continue
                self.apply(job_id, drained)
            except ray.exceptions.GetTimeoutError:
                log.warning("supervisor of %s did not answer within %.0fs", job_id, DRAIN_TIMEOUT_S)
            except ray.exceptions.ActorUnavailableError:
                # Alive but unreachable this moment (a loaded node, a network blip): a RayActorError
                # too, but recovering would start a second supervisor beside a live one (found by
                # the soak: the job then FAILED on its group's duplicate name). Ask again next tick.
                log.warning("supervisor of %s is unavailable for now", job_id)
            except ray.exceptions.RayActorError:
                self.handles.pop(job_id, None)
                self.recover(job_id)
        for job_id in set(self.handles) - {j[0] for j in jobs}:
            self._retire(job_id)
        self.metrics.retain({j[0] for j in jobs})

    def _hand_over(self, job_id: str) -> None:
        with self.sessions() as s:
            job = repo.get_job(s, job_id)
            if job is None or job.state in TERMINAL:
                return
            args = (job_id, job.spec, self.settings.job_storage(job_id).uri, job.supervisor_epoch,
                    repo.metric_stride(job.total_steps, self.settings.metrics_max_points), client_env(),
                    restarts_used(s, job_id))
        if self._leading():
            self.handles[job_id].start.remote(*args)

    # --- one drain into the database ---------------------------------------

    def apply(self, job_id: str, drained: dict) -> None:
        finished = False
        stored: list[dict] = []  # records new to the database: metrics see each once, after the commit
        spec = None
        with self.sessions.begin() as s:
            job = repo.get_job(s, job_id, lock=True)
            if job is None or job.state in TERMINAL or drained["epoch"] != job.supervisor_epoch:
                finished = job is not None and job.state in TERMINAL
            else:
                steps = []
                for rec in drained["records"]:
                    if rec["seq"] <= job.drained_seq:
                        continue
                    if rec["type"] == "state" and JobState(rec["state"]).terminal and not drained["done"]:
                        break  # the run's summary follows at once: store the end with it (next drain)
                    stored.append(rec)
                    if rec["type"] == "state":
                        self._apply_state(s, job, JobState(rec["state"]), rec["message"])
                    elif rec["type"] == "event":
                        repo.add_event(s, job.id, rec["kind"], rec["message"], data=rec["data"])
                        if rec["kind"] == "checkpoint":
                            step = rec["data"]["step"]
                            job.last_checkpoint_step = step
                            where = checkpoint_root(self.settings.job_storage(job.id)) / step_name(step)
                            repo.record_checkpoint(s, job.id, step, where.uri)
                            rec["data"] = {**rec["data"], "bytes": _checkpoint_bytes(where)}
                            if isinstance(rec.get("event"), CheckpointEvent):  # what the metrics read
                                rec["event"] = replace(rec["event"], bytes=rec["data"]["bytes"])
                    elif rec["type"] == "step":
                        steps.append(rec)
                    job.drained_seq = rec["seq"]
                if steps:
                    repo.record_steps(s, job, steps, self.settings.metrics_max_points)
                    last = steps[-1]
                    job.step, job.loss = last["step"], last["loss"]
                    job.samples_per_s, job.step_time_s = last.get("samples_per_s"), last.get("step_time_s")
                job.restarts = job.restarts_base + drained["restarts"]
                spec = job.spec
                job.layout = drained["layout"]
                if drained.get("tracking"):  # the MLflow run id appears once the run exists on the server
                    job.tracking = drained["tracking"]
                summary = drained["summary"]
                if job.state == JobState.QUEUED:  # preempted: its next supervisor resumes from the checkpoint
                    job.restarts_base = job.restarts  # a preemption is not a failure: restarts carry over
                    finished = True  # this supervisor's work is over
                elif drained["done"] and summary is not None:
                    job.summary = self._complete_summary(s, job, summary)
                    job.error = summary.get("error")
                    self._apply_state(s, job, JobState(summary["state"]), job.error or "run finished")
                    finished = True
        if spec is not None:
            self.metrics.drained(job_id, stored, drained.get("layout"), spec)
        if finished:
            self._retire(job_id)

    @staticmethod
    def _complete_summary(s: Session, job, summary: dict) -> dict:
        """A replacement supervisor only saw the steps after its resume point: fill in the job-wide view."""
        summary = dict(summary)
        first = repo.list_metrics(s, job.id, 0, 1)
        if first:
            summary["initial_loss"] = first[0].loss
        summary["steps"] = max(summary.get("steps") or 0, job.step)
        if summary.get("final_loss") is None:
            summary["final_loss"] = job.loss
        summary["restarts"] = job.restarts
        summary["preemptions"] = preemption.count(s, job.id)
        return summary

    def _apply_state(self, s: Session, job, target: JobState, message: str) -> None:
        if target == job.state:
            return
        if target == JobState.STARTING and job.state in (JobState.RECOVERING, JobState.RUNNING):
            return  # a replacement supervisor re-forming the group: the job stays RECOVERING
        try:
            repo.transition(s, job, target, message)
        except IllegalTransition as exc:
            repo.add_event(s, job.id, "ignored_transition", str(exc), data={"from": job.state, "to": str(target)})

    # --- supervisors that vanished -----------------------------------------

    def recover(self, job_id: str) -> None:
        with self.sessions.begin() as s:
            job = repo.get_job(s, job_id, lock=True)
            if job is None or job.state in TERMINAL or job.state == JobState.QUEUED:
                return
            if job.cancel_requested:
                repo.transition(s, job, JobState.CANCELLED, "cancelled (its supervisor had already stopped)")
                return
            never_started = job.state == JobState.STARTING and job.drained_seq == 0
            used = restarts_used(s, job_id)
            if not never_started:
                reason = "supervisor lost (control plane or node restart)"
                limits = FaultToleranceSpec.model_validate(job.spec.get("fault_tolerance") or {})  # only what it needs
                decision = on_failure(FailureStatus(reason, used, limits,
                                                    job.step, cause=RestartCause.SUPERVISOR_LOST))
                if decision.action == FailureAction.FAIL:
                    job.error = decision.reason
                    repo.transition(s, job, JobState.FAILED, job.error)
                    return
                used = used.plus(RestartCause.SUPERVISOR_LOST)
                resume = resume_step(self.settings.job_storage(job_id), job.spec.get("program") is not None)
                if resume > job.step:  # trained, but its telemetry went down with the supervisor
                    repo.add_event(s, job.id, "telemetry_gap", f"steps {job.step + 1}..{resume} trained but their "
                                   "per-step metrics were lost with the supervisor",
                                   data={"from_step": job.step + 1, "to_step": resume})
                    job.step = resume
                if job.state != JobState.RECOVERING:
                    repo.transition(s, job, JobState.RECOVERING, f"{reason}; restarting from step {resume}")
                job.restarts_base = job.restarts = job.restarts + 1
                restart = RestartEvent(job.restarts, resume, reason, RestartCause.SUPERVISOR_LOST,
                                       f"{decision.reason}; new supervisor resumes from step {resume}")
                repo.add_event(s, job.id, restart.kind, restart.message, data=restart.data())
                self.metrics.restarted(job.id, restart)
            job.supervisor_epoch += 1
            job.drained_seq = 0
            reservation = self.launcher.reserve()
            job.supervisor_name = self.launcher.name(reservation, job.id, job.supervisor_epoch)
            spec, epoch, total = job.spec, job.supervisor_epoch, job.total_steps
        if not self._leading():  # lost the lease since the commit: the new leader starts it
            return
        try:
            self.handles[job_id] = self.launcher.launch(reservation, job_id, spec, epoch, total, used)
        except Exception as exc:  # e.g. Ray unreachable: the next tick tries again
            log.warning("restarting the supervisor of %s failed: %s", job_id, exc)

    def _note_reattach(self, job_id: str) -> None:
        with self.sessions.begin() as s:
            repo.add_event(s, job_id, "reattach", "control plane attached to the running supervisor")

    def _retire(self, job_id: str) -> None:
        """The job is over and stored: stop its supervisor (its workers are already gone)."""
        handle = self.handles.pop(job_id, None)
        if handle is None:
            with self.sessions() as s:
                job = repo.get_job(s, job_id)
                handle = find_supervisor(job.supervisor_name if job else None)
        if handle is not None:
            try:
                ray.kill(handle, no_restart=True)
            except Exception:
                pass


def _checkpoint_bytes(checkpoint: Storage) -> int | None:
    """Bytes of a checkpoint's files on its store (one listing); None if the store does not answer."""
    try:
        return sum(checkpoint.sizes().values()) or None
    except Exception:  # a store outage must not stop the drain
        return None
