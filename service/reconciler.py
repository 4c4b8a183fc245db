"""Reconciler: copies what supervisors report into the database and recovers lost ones.

Each pass, for every STARTING/RUNNING/RECOVERING job:
- its supervisor (found by name, so a restarted control plane re-attaches) is
  drained; state changes go through the lifecycle table and become events,
  steps become (downsampled) metrics, checkpoints become rows; the records'
  sequence number is stored in the same transaction and acknowledged on the
  next drain, so nothing is lost or stored twice;
- a job whose supervisor is gone is restarted with a new supervisor on the
  same job directory, which resumes from the latest checkpoint (or cancelled,
  if a cancel was pending). No accepted job is dropped.

A pass costs a few statements, not a few per job: one read of the active jobs' columns; the
drains gathered under one deadline (half the loop's interval; a drain not back by then is
gathered again next pass: service/unanswered_drains.py); then every drain with something new
stored in one transaction by service/drain_store.py (one `SELECT ... FOR UPDATE` of those jobs'
columns, the events in one multi-row insert at the flush, the metrics in one upsert, the jobs'
progress in one UPDATE over arrays). If that transaction fails, each job is stored in one of its
own, so one bad drain loses no other job's. The metrics see the stored records after the commit;
checkpoint sizes are listed on the store afterwards, off this thread (service/checkpoint_sizes.py),
so a slow store never holds a pass; the supervisors of ended jobs are killed off it too (a kill is a
call to the cluster, which a loaded cluster answers late: seconds, at a fleet's size).

The scheduler runs on a thread of its own (service/control.py) and shares `handles` and the
supervisor launcher with this one. This pass takes `launch_lock` around what it reads of the jobs
and the handles and around restarting a supervisor; the scheduler takes no lock against it: it marks
a job launching before its admission commits, so a job it has committed but not yet handed to its
supervisor is never taken for a lost one, and this pass snapshots the handles before it reads the
jobs, so it never retires the handle of a job admitted after its read. Drains are gathered and stored
outside the lock: neither loop waits for the other.

With several control-plane replicas only the lease holder reconciles, and its
sessions are fenced (service/leases.py): a replica that lost the lease cannot
store a drain or restart a job, and does not start a supervisor after its
commit, so a job is never restarted twice. `supervisor_epoch` fences the
supervisors themselves: a drain from an older epoch is ignored.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from service import preemption
from service.background import Background
from service.checkpoint_sizes import CheckpointSizer, Sizing
from service.cluster_port import Cluster, ReplyKind
from service.db import batched
from service.db import repository as repo
from service.db.engine import SessionSource
from service.drain_store import DrainStore, Stored, has_news
from service.leases import LeaseLost
from service.lifecycle import TERMINAL, JobState
from service.live_metrics import LiveMetrics
from service.restart_history import restarts_used
from service.settings import Settings
from service.supervisor.launch import Launcher
from service.supervisor.policies.failure import FailureAction, FailureStatus, on_failure
from service.supervisor.resume_point import resume_step
from service.supervisor_handles import Handles
from service.unanswered_drains import UnansweredDrains
from workers.events import RestartCause, RestartEvent
from workers.spec import FaultToleranceSpec
from workers.storage import client_env

log = logging.getLogger("trainyard.reconciler")
JOBS_PER_TRANSACTION = 1000  # a pass's drains are stored in transactions of at most this many jobs
FEED_MAX_PENDING = 20_000  # jobs' drains waiting for the metrics feed before a pass waits for it
KILLS_MAX_PENDING = 10_000  # supervisors waiting to be killed before a pass waits for room


class Reconciler:
    def __init__(self, sessions: SessionSource, settings: Settings, launcher: Launcher | None = None,
                 metrics: LiveMetrics | None = None, cluster: Cluster | None = None):
        if cluster is None:
            from service.ray_cluster import RayCluster

            cluster = RayCluster(settings)
        self.sessions, self.settings, self.cluster = sessions, settings, cluster
        self.launcher = launcher or Launcher(settings, cluster=cluster)
        self.metrics = metrics or LiveMetrics(retention_s=settings.metrics_retention_s)
        self.handles = Handles()  # job id -> supervisor actor handle (the scheduler adds the ones it starts)
        # Held around reading the jobs and handles and starting or stopping supervisors; the control
        # loop's scheduler thread holds it around its tick (service/control.py).
        self.launch_lock = threading.RLock()
        self.sizer = CheckpointSizer(sessions, self.metrics)
        # The live metrics are fed the stored records after the commit, in order, on a thread of their
        # own: the next pass does not wait for them (a feed that falls far behind does hold it up).
        self.feed: Background[tuple] = Background("trainyard-metrics-feed", self._feed, FEED_MAX_PENDING, block=True)
        # Supervisors of ended jobs are killed on a thread of their own: a pass never waits for the cluster
        # to answer a kill. Safe to defer: a job's next supervisor (a requeued job's) has a new name.
        self.kills: Background[Any] = Background("trainyard-supervisor-kills", self._kill_all, KILLS_MAX_PENDING,
                                                 block=True)
        self.drains = DrainStore(sessions, settings)
        self.waiting = UnansweredDrains()  # drains past a pass's deadline, gathered again next pass
        # A pass waits for its supervisors at most half its interval, so it keeps its cadence on a loaded
        # cluster; a supervisor not back by then is answered in a later pass, never asked twice meanwhile.
        self.drain_deadline_s = max(0.05, settings.loop_interval_s / 2)
        self.on_job_end: Callable[[], None] = lambda: None  # a job ended or was requeued: capacity freed

    def _leading(self) -> bool:
        """Still the lease holder (always, with plain sessions: one replica)."""
        return getattr(self.sessions, "still_leading", lambda: True)()

    def tick(self) -> None:
        with self.launch_lock:
            # The handles before the jobs: a handle is put in only after its job's admission commits, so each
            # one here whose job is not in the read below belongs to a job that left the active states (the
            # scheduler admits without this lock: a handle taken after the read could be a new job's).
            handles = self.handles.snapshot()
            with self.sessions() as s:
                rows = batched.active_rows(s)
            known = {row.id: row for row in rows}
            for job_id, handle in handles.items():
                if job_id not in known:  # ended, or requeued: its supervisor's work is over
                    self._retire(job_id, handle)
            preempts = preemption.pending(None, rows)  # asked by the scheduler, resent until requeued
            refs: dict[str, Any] = {}
            drained_by: dict[str, Any] = {}  # the handle each drain went to
            lost, reattached = [], []
            for row in rows:
                handle = self.handles.get(row.id)
                if handle is None and self.handles.is_launching(row.id):
                    continue  # admitted, its supervisor being started (service/scheduler_launches.py)
                if handle is None:
                    handle = self.cluster.find_supervisor(row.supervisor_name)
                    if handle is None:
                        lost.append(row.id)
                        continue
                    self.handles[row.id] = handle
                    reattached.append(row.id)
                if row.cancel_requested:
                    handle.cancel.remote()
                elif row.id in preempts:
                    handle.preempt.remote(preempts[row.id], row.supervisor_epoch)
                refs[row.id] = self.waiting.ref(row.id, handle) or handle.drain.remote(row.drained_seq)
                drained_by[row.id] = handle
            self._note_reattach(reattached)
            for job_id in lost:
                self.recover(job_id)
        # One deadline for every drain: a slow supervisor delays this pass by at most drain_deadline_s,
        # not a timeout per job. No lock held: the scheduler admits meanwhile.
        drains = {}
        replies = self.cluster.gather(refs, self.drain_deadline_s)
        self.waiting.update(replies, refs, drained_by)
        for job_id, reply in replies.items():
            if reply.kind == ReplyKind.NO_ANSWER:
                continue  # still in flight: gathered again next pass (self.waiting), logged if it stays out
            if reply.kind == ReplyKind.ANSWERED:
                if not reply.value["started"]:  # admitted, but the control plane died before handing it the job
                    self._hand_over(job_id, drained_by[job_id])
                    continue
                drains[job_id] = reply.value
            elif reply.kind == ReplyKind.GONE:
                with self.launch_lock:
                    if self.handles.take_if(job_id, drained_by[job_id]):
                        self.recover(job_id)
            else:
                # Alive but unreachable this moment (a loaded node, a network blip), or the call raised:
                # recovering would start a second supervisor beside a live one (found by the soak:
                # the job then FAILED on its group's duplicate name). Ask again next pass.
                log.warning("supervisor of %s: %s (%s)", job_id, reply.kind.value, reply.error)
        self.apply_many(drains, known, drained_by)
        self.metrics.retain(set(known))
        self.drains.forget_specs_but(set(known))

    def _hand_over(self, job_id: str, handle: Any) -> None:
        with self.sessions() as s:
            job = repo.get_job(s, job_id)
            if job is None or job.state in TERMINAL:
                return
            args = (job_id, job.spec, self.settings.job_storage(job_id).uri, job.supervisor_epoch,
                    repo.metric_stride(job.total_steps, self.settings.metrics_max_points), client_env(),
                    restarts_used(s, job_id))
        if self._leading():
            handle.start.remote(*args)

    # --- drains into the database --------------------------------------------

    def apply(self, job_id: str, drained: dict) -> None:
        """Store one supervisor's drain (as a pass stores many: apply_many), its metrics fed on return."""
        self.apply_many({job_id: drained})
        self.feed.wait_idle()

    def apply_many(self, drains: dict[str, dict], known: dict[str, Any] | None = None,
                   handles: dict[str, Any] | None = None) -> None:
        """Store the drains (job id -> what its supervisor returned). `known`: the pass's read of the
        jobs' columns; a drain with nothing new against it is skipped without a statement.
        `handles`: the handle each drain came from (the one retired if the job's run is over)."""
        todo = {job_id: d for job_id, d in drains.items()
                if known is None or job_id not in known or has_news(known[job_id], d)}
        ids = list(todo)
        stored: dict[str, Stored] = {}
        for i in range(0, len(ids), JOBS_PER_TRANSACTION):
            chunk = {job_id: todo[job_id] for job_id in ids[i:i + JOBS_PER_TRANSACTION]}
            try:
                stored.update(self.drains.store(chunk))
            except LeaseLost:
                raise
            except Exception:
                if len(chunk) == 1:
                    log.exception("storing the drain of job %s failed; it is drained again next pass", *chunk)
                    continue
                log.exception("storing %d drains together failed; storing them one job at a time", len(chunk))
                for job_id, drained in chunk.items():
                    try:
                        stored.update(self.drains.store({job_id: drained}))
                    except LeaseLost:
                        raise
                    except Exception:
                        log.exception("storing the drain of job %s failed; it is drained again next pass", job_id)
        # Committed: the metrics see each new record once; the store is asked for sizes off this thread.
        self.feed.submit([(job_id, out.records, todo[job_id].get("layout"), out.spec)
                          for job_id, out in stored.items() if out.spec is not None])
        self.sizer.submit([Sizing(job_id, event.id, dict(event.data), where)
                           for job_id, out in stored.items() for event, where in out.checkpoints])
        ended = [job_id for job_id, out in stored.items() if out.finished]
        for job_id in ended:
            self._retire(job_id, (handles or {}).get(job_id))
        if ended:
            self.on_job_end()

    def _feed(self, batch: list[tuple]) -> None:
        for job_id, records, layout, spec in batch:
            self.metrics.drained(job_id, records, layout, spec)

    def _kill_all(self, handles: list[Any]) -> None:
        for handle in handles:
            try:
                self.cluster.kill(handle)
            except Exception as exc:  # already gone, or the cluster unreachable: the orphan sweep retries
                log.warning("killing a retired supervisor failed: %s: %s", type(exc).__name__, exc)

    def drain_background(self, timeout_s: float = 30.0) -> bool:
        """Until the drains stored so far have fed the metrics, their checkpoints are sized and the retired
        supervisors killed (tests, benches)."""
        return (self.feed.wait_idle(timeout_s) and self.sizer.worker.wait_idle(timeout_s)
                and self.kills.wait_idle(timeout_s))

    # --- supervisors that vanished -----------------------------------------

    def recover(self, job_id: str) -> None:
        with self.launch_lock:  # the launcher and its standby pool are the scheduler's too
            self._recover(job_id)

    def _recover(self, job_id: str) -> None:
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

    def _note_reattach(self, job_ids: list[str]) -> None:
        if not job_ids:
            return
        with self.sessions.begin() as s:
            for job_id in job_ids:
                repo.add_event(s, job_id, "reattach", "control plane attached to the running supervisor")

    def _retire(self, job_id: str, handle: Any = None) -> None:
        """The job is over and stored: stop its supervisor (its workers are already gone). `handle`:
        the supervisor to stop; the job's handle is forgotten only if it is still that one."""
        with self.launch_lock:
            if handle is not None:
                self.handles.take_if(job_id, handle)
            else:
                handle = self.handles.pop(job_id, None)
            if handle is None:
                with self.sessions() as s:
                    job = repo.get_job(s, job_id)
                    handle = self.cluster.find_supervisor(job.supervisor_name if job else None)
        if handle is not None:
            self.kills.submit([handle])

    def close(self) -> None:
        """Stepping down: forget the handles; the metrics of what was stored are still fed, the retired
        supervisors still killed (any left over are the next leader's orphan sweep's)."""
        self.handles.clear()
        self.feed.wait_idle(5.0)
        self.feed.close()
        self.kills.wait_idle(5.0)
        self.kills.close()
        self.sizer.worker.close()
