"""The per-job supervisor: a named, detached Ray actor that owns one JobRun.

It runs the worker runtime (JobRun) in a thread and keeps what the run reports
(state changes, events, step records) in a numbered buffer (service/supervisor/record_buffer.py),
which the reconciler drains.

A supervisor can be created idle (a standby, with the runtime already imported) and
handed a job later with `start(...)`; the job's row records the actor's name, which is how a
restarted control plane finds it again.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable

import ray
from ray.actor import ActorHandle

from service.lifecycle import JobState
from service.ray_client import NAMESPACE
from service.supervisor.policies.failure import RestartsUsed
from service.supervisor.record_buffer import RecordBuffer
from service.supervisor.run import JobRun
from workers.events import RunEvent
from workers.os_thread_name import name_os_thread
from workers.spec import JobSpec
from workers.storage import Storage, adopt_client_env

SUPERVISOR_PREFIX = "trainyard-supervisor-"
SUPERVISOR_SHARE = 0.001  # of the supervisors' resource each asks: a node given 1000 of it holds 1000


def supervisor_name(job_id: str, epoch: int) -> str:
    """The name of a supervisor started for one job (standbys are named by their pool)."""
    return f"{SUPERVISOR_PREFIX}{job_id}-{epoch}"


class Supervisor:
    """The supervisor's logic as a plain class: the Ray actor below, and unchanged the fleet
    simulator's supervisors (bench/fleet/), which pass a `make_run` building JobRun on simulated ranks."""

    def __init__(self, make_run: Callable[..., JobRun] = JobRun) -> None:
        self.make_run = make_run
        self._lock = threading.Lock()
        self._records = RecordBuffer()
        self._summary: dict | None = None
        self._run: JobRun | None = None
        self.job_id: str | None = None
        self.epoch, self.metric_stride = 0, 1

    def ready(self) -> bool:
        return True

    def start(self, job_id: str, spec_json: dict, job_uri: str, epoch: int, metric_stride: int = 1,
              store_env: dict[str, str] | None = None, restarts_before: RestartsUsed = RestartsUsed()) -> bool:
        """Take on a job whose files live at `job_uri` (a local directory or an object store, reached
        with the forwarded `store_env`), which has had `restarts_before` (its budgets are the job's).
        Idempotent: False (and no change) if this supervisor already runs one."""
        with self._lock:
            if self._run is not None:
                return False
            adopt_client_env(store_env)
            # The spec was validated at submit (fault injection included), so no policy is re-applied here.
            spec = JobSpec.model_validate(spec_json)
            self.job_id, self.epoch, self.metric_stride = job_id, epoch, max(1, metric_stride)
            self._run = self.make_run(spec, Storage.at(job_uri), job_id, listener=self,
                                      restarts_before=restarts_before, epoch=epoch)
        threading.Thread(target=self._main, name=f"jobrun-{job_id}", daemon=True).start()
        return True

    # --- RunListener (called from the run thread) ---------------------------

    def _push(self, record: dict) -> None:
        self._records.push(record)

    def on_state(self, state, message: str) -> None:
        self._push({"type": "state", "state": str(state), "message": message})

    def on_event(self, event: RunEvent) -> None:
        # kind, message and data are what the database and REST keep; the typed event travels
        # beside them to the control plane's metrics (labels from its fields).
        self._push({"type": "event", "kind": event.kind, "message": event.message, "data": event.data(),
                    "event": event})

    def on_step(self, record: dict) -> None:
        run = self._run
        assert run is not None, "the run reports steps only once start() has set it"
        step = record["step"]
        if step % self.metric_stride and step != run.spec.total_steps:
            return
        self._push({"type": "step", **record})  # per-rank entries feed the per-rank metrics

    def _main(self) -> None:
        run = self._run
        assert run is not None, "start() sets the run before it starts this thread"
        name_os_thread("jobrun")  # the supervisor's poll loop, one row of bench/overhead.py
        try:
            summary = run.run()
        except BaseException as exc:  # the run itself broke: report it as a failed job
            run.error = f"supervisor error: {exc!r}"
            summary = run.summary() | {"state": str(JobState.FAILED), "error": run.error}
            self.on_state(JobState.FAILED, run.error + "\n" + traceback.format_exc(limit=3))
        with self._lock:
            self._summary = summary

    # --- called by the control plane ----------------------------------------

    def drain(self, ack: int) -> dict:
        """Forget records up to `ack` (stored by the caller) and return the rest plus the run's status."""
        with self._lock:  # the summary is set under this lock after the run's last record: both or neither
            return {"records": self._records.drain(ack), **self._status()}

    def status(self) -> dict:
        with self._lock:
            return self._status()

    def _status(self) -> dict:
        run = self._run
        if run is None:
            return {"job_id": None, "epoch": 0, "started": False, "done": False, "summary": None, "seq": 0}
        return {"job_id": self.job_id, "epoch": self.epoch, "started": True, "state": str(run.state),
                "restarts": run.restarts, "last_checkpoint_step": run.last_checkpoint_step, "layout": run.layout(),
                "done": self._summary is not None, "summary": self._summary, "seq": self._records.seq,
                "tracking": run.tracking_info(), "phase": run.phase()}

    def cancel(self) -> bool:
        if self._run is not None:
            self._run.cancel()
        return True

    def preempt(self, by: str, epoch: int) -> bool:
        """Checkpoint and stop for job `by` (service/preemption.py). Fenced by the epoch: a request
        meant for an earlier supervisor of this job is ignored."""
        if self._run is None or epoch != self.epoch:
            return False
        self._run.preempt(by)
        return True


@ray.remote(num_cpus=0, max_concurrency=4, max_restarts=0)
class JobSupervisor(Supervisor):
    """The supervisor as a Ray actor. It never imports torch (tests/service/test_supervisor_torch_free.py):
    what it needs of the training stack is torch-free (strategy names, stage plans, checkpoint layout),
    and the pipeline cost model runs in a child process (workers/parallel/pipeline/unit_costs_apart.py)."""


def create_supervisor(name: str, resource: str = "", memory_mb: int = 0) -> ActorHandle:
    """An idle supervisor that outlives the control plane that created it; placed where `resource` is
    (a custom Ray resource, a sliver of it each) with `memory_mb` reserved, when given."""
    placement: dict = {}
    if resource:
        placement["resources"] = {resource: SUPERVISOR_SHARE}
    if memory_mb:
        placement["memory"] = memory_mb * 2**20
    # @ray.remote turns the class into an ActorClass (with .options); mypy still sees the plain class
    return JobSupervisor.options(  # type: ignore[attr-defined]
        name=name, namespace=NAMESPACE, lifetime="detached", **placement).remote()


def find_supervisor(name: str | None) -> ActorHandle | None:
    """The live supervisor with this name, or None."""
    if not name:
        return None
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return None
