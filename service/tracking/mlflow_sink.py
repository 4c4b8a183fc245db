"""MLflow: one run per job, created on first delivery and continued by every later supervisor.

Everything here runs on the sink's background thread (service/tracking/background.py): the
import of mlflow, the run's creation, each log_batch. The client gets short HTTP timeouts and
no retries of its own, since the background logger retries whole batches with backoff and a
client that retried for minutes would hold records back long after the server came back.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import replace
from typing import Any

from service.tracking import run_file
from service.tracking.records import RunEnd, RunTags, StepMetrics, TrackingItem
from workers.spec import MlflowTrackingSpec
from workers.storage import Storage

log = logging.getLogger("trainyard.tracking")

CLIENT_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
METRICS_PER_CALL, TAGS_PER_CALL = 1000, 100  # MLflow's log_batch limits
# A supervisor lost and replaced is a restart only the control plane records (its event is in REST);
# the run counts the supervisors that continued it instead.
SUPERVISORS_TAG = "trainyard.supervisors"


def _chunks(items: list, n: int) -> list[list]:
    return [items[i:i + n] for i in range(0, len(items), n)]


class MlflowSink:
    name = "mlflow"

    def __init__(self, spec: MlflowTrackingSpec, job: Storage | str | os.PathLike, job_id: str, job_name: str,
                 params: dict[str, str]):
        self.spec, self.job, self.job_id, self.params = spec, run_file.job_storage(job), job_id, params
        self.run_name = spec.run_name or f"{job_name}-{job_id[:8]}"
        self.ref = run_file.load(self.job, spec.tracking_uri)  # a run an earlier supervisor started
        self._client: Any = None
        self._resumed = False
        for key, value in CLIENT_ENV.items():
            os.environ.setdefault(key, value)  # read by mlflow at each request; the deployer's value wins

    def info(self) -> dict[str, Any]:
        ref = self.ref
        return {"tracking_uri": self.spec.tracking_uri, "experiment": self.spec.experiment,
                "experiment_id": ref.experiment_id if ref else None, "run_id": ref.run_id if ref else None}

    def send(self, batch: list[TrackingItem]) -> None:
        client, run_id = self._run()
        from mlflow.entities import Metric, RunTag

        metrics = [Metric(name, value, item.ts_ms, item.step) for item in batch if isinstance(item, StepMetrics)
                   for name, value in item.values.items()]
        tags: dict[str, str] = {}
        for item in batch:
            if isinstance(item, RunTags):
                tags.update(item.tags)
        for chunk in _chunks(metrics, METRICS_PER_CALL):
            client.log_batch(run_id, metrics=chunk, synchronous=True)
        for chunk in _chunks([RunTag(k, v) for k, v in tags.items()], TAGS_PER_CALL):
            client.log_batch(run_id, tags=chunk, synchronous=True)
        for item in batch:
            if isinstance(item, RunEnd):
                self._end(client, run_id, item)

    def close(self) -> None:
        pass  # the client holds no open resources worth closing

    # --- the run ------------------------------------------------------------------------

    def _run(self) -> tuple[Any, str]:
        if self._client is None:
            from mlflow import MlflowClient

            self._client = MlflowClient(tracking_uri=self.spec.tracking_uri)
        client = self._client
        if self.ref is not None and not self._resumed:
            try:
                client.update_run(self.ref.run_id, status="RUNNING")  # continued by this supervisor
                self.ref = replace(self.ref, supervisors=self.ref.supervisors + 1)
                client.set_tag(self.ref.run_id, SUPERVISORS_TAG, str(self.ref.supervisors))
                run_file.save(self.job, self.ref)
                self._resumed = True
            except Exception as exc:
                if getattr(exc, "error_code", None) != "RESOURCE_DOES_NOT_EXIST":
                    raise
                log.warning("MLflow run %s is gone from the server: starting a new one", self.ref.run_id)
                self.ref = None
        if self.ref is None:
            self.ref = self._create(client)
            self._resumed = True
        if not self.ref.params_logged:
            self._log_params(client, self.ref.run_id)
        return client, self.ref.run_id

    def _create(self, client: Any) -> run_file.MlflowRunRef:
        experiment = client.get_experiment_by_name(self.spec.experiment)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            try:
                experiment_id = client.create_experiment(self.spec.experiment)
            except Exception:  # another job created it meanwhile
                experiment = client.get_experiment_by_name(self.spec.experiment)
                if experiment is None:
                    raise
                experiment_id = experiment.experiment_id
        tags = {**self.spec.tags, "trainyard.job_id": self.job_id, SUPERVISORS_TAG: "1"}
        run = client.create_run(experiment_id, run_name=self.run_name, tags=tags)
        ref = run_file.MlflowRunRef(self.spec.tracking_uri, experiment_id, run.info.run_id)
        run_file.save(self.job, ref)  # before anything else: a new supervisor must find this run
        log.info("MLflow run %s in experiment %s", ref.run_id, experiment_id)
        return ref

    def _log_params(self, client: Any, run_id: str) -> None:
        from mlflow.entities import Param

        params = [Param(k, v) for k, v in sorted(self.params.items())]
        for chunk in _chunks(params, TAGS_PER_CALL):
            client.log_batch(run_id, params=chunk, synchronous=True)
        assert self.ref is not None
        self.ref = replace(self.ref, params_logged=True)
        run_file.save(self.job, self.ref)

    def _end(self, client: Any, run_id: str, end: RunEnd) -> None:
        for path in end.artifacts:
            if path.is_dir():
                client.log_artifacts(run_id, str(path), artifact_path=path.name)
            elif path.exists():
                client.log_artifact(run_id, str(path))
        client.set_terminated(run_id, status=end.status, end_time=int(time.time() * 1000))
