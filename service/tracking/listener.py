"""A RunListener that also sends what the run reports to the job's tracking sinks.

It wraps the supervisor's own listener: the database path sees every call first and unchanged,
then the record is queued for MLflow and TensorBoard (never blocking: service/tracking/background.py).
Drops come back to the wrapped listener as `tracking_dropped` events.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from service.lifecycle import JobState
from service.supervisor.listener import RunListener
from service.tracking.background import BackgroundLogger
from service.tracking.mlflow_sink import MlflowSink
from service.tracking.records import RunEnd, RunTags, StepMetrics, TrackingItem, flat_params, step_metrics
from service.tracking.run_file import job_storage
from service.tracking.tensorboard_sink import TensorBoardSink
from workers.events import ResizeEvent, RestartEvent, RunEvent
from workers.spec import JobSpec
from workers.storage import Storage

# How a finished job's state reads in MLflow; a preempted (QUEUED) run stays RUNNING for its next supervisor.
END_STATUS = {JobState.SUCCEEDED: "FINISHED", JobState.FAILED: "FAILED", JobState.CANCELLED: "KILLED"}
CLOSE_TIMEOUT_S = 30.0  # the longest a finished job waits for its last records and its model to go out
EXPORTS = ("model.safetensors", "hf")  # the exported model in the job's storage (docs/jobs.md: the job directory)


class TrackingListener:
    def __init__(self, inner: RunListener, spec: JobSpec, job: Storage | str | os.PathLike, job_id: str):
        self.inner, self.job = inner, job_storage(job)
        self.sinks: dict[str, MlflowSink | TensorBoardSink] = {}
        if spec.tracking.mlflow is not None:
            params = flat_params(spec.model_dump(mode="json"))
            self.sinks["mlflow"] = MlflowSink(spec.tracking.mlflow, self.job, job_id, spec.name, params)
        if spec.tracking.tensorboard:
            self.sinks["tensorboard"] = TensorBoardSink(self.job)
        self.loggers = [BackgroundLogger(sink, inner.on_event) for sink in self.sinks.values()]
        self.state, self.step, self.restarts, self.resizes = JobState.STARTING, 0, 0, 0

    def info(self) -> dict[str, Any]:
        """What the job's REST view shows: the MLflow run (once created) and the TensorBoard directory."""
        return {name: sink.info() for name, sink in self.sinks.items()}

    # --- RunListener -----------------------------------------------------------------------

    def on_state(self, state: JobState, message: str) -> None:
        self.inner.on_state(state, message)
        self.state = state
        self._put(RunTags({"trainyard.state": str(state)}))

    def on_event(self, event: RunEvent) -> None:
        self.inner.on_event(event)
        if isinstance(event, RestartEvent):
            self.restarts += 1
            self._put(RunTags({"trainyard.restarts": str(self.restarts), "trainyard.last_restart": event.message}))
            self._put(StepMetrics(self.step, int(time.time() * 1000), {"restarts": float(self.restarts)}))
        elif isinstance(event, ResizeEvent):
            self.resizes += 1
            self._put(RunTags({"trainyard.resizes": str(self.resizes), "trainyard.last_resize": event.message}))
            self._put(StepMetrics(self.step, int(time.time() * 1000),
                                  {"world_size": float(event.after["world_size"])}))

    def on_step(self, record: dict[str, Any]) -> None:
        self.inner.on_step(record)
        metrics = step_metrics(record)
        self.step = metrics.step
        if metrics.values:
            self._put(metrics)

    # --- the end of the run ----------------------------------------------------------------

    def finish(self, final_val_loss: float | None) -> None:
        """Log the final validation loss and the exported model, end the run, and stop the loggers
        (a bounded wait: a tracking server that is down costs the job at most CLOSE_TIMEOUT_S)."""
        now = int(time.time() * 1000)
        if final_val_loss is not None:
            self._put(StepMetrics(self.step, now, {"final_val_loss": float(final_val_loss)}))
        status = END_STATUS.get(self.state)
        staged: Path | None = None
        if status is not None:
            exports: tuple[Path, ...] = ()
            if self.state == JobState.SUCCEEDED and "mlflow" in self.sinks:
                exports, staged = self._local_exports()
            self._put(RunEnd(status, exports))
        deadline = time.monotonic() + CLOSE_TIMEOUT_S
        for logger in self.loggers:
            logger.close(max(1.0, deadline - time.monotonic()))
        if staged is not None:
            shutil.rmtree(staged, ignore_errors=True)

    def _local_exports(self) -> tuple[tuple[Path, ...], Path | None]:
        """The exported model as local paths for MLflow's upload: in place on local storage, else fetched
        into a temporary directory (returned, to be removed once the run has ended)."""
        present = [name for name in EXPORTS if self.job.exists(name)]
        if self.job.is_local:
            return tuple(self.job.local_path / name for name in present), None
        staged = Path(tempfile.mkdtemp(prefix="trainyard-exports-"))
        for name in present:
            self.job.download(name, staged / name)
        return tuple(staged / name for name in present), staged

    def _put(self, item: TrackingItem) -> None:
        for logger in self.loggers:
            logger.put(item)


def tracked(listener: RunListener, spec: JobSpec, job: Storage | str | os.PathLike,
            job_id: str) -> TrackingListener | None:
    """The tracking listener around `listener` when the spec asks for tracking, else None."""
    return TrackingListener(listener, spec, job, job_id) if spec.tracking.enabled else None
