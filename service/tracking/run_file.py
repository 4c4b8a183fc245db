"""The job's MLflow run, kept in the job's storage (a directory or an object store) so that every
supervisor of the job, on any node, continues it.

A restart inside one supervisor keeps its sink; a new supervisor (the control plane replaced a
lost one, or a preempted job admitted again) reads this file and resumes the same run.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

from workers.storage import Storage

RUN_FILE = "tracking.json"


@dataclass(frozen=True)
class MlflowRunRef:
    tracking_uri: str
    experiment_id: str
    run_id: str
    params_logged: bool = False  # the spec's params went out (they are logged once per run)
    supervisors: int = 1  # supervisors that logged to the run: one more after each supervisor restart or requeue


def job_storage(job: Storage | str | os.PathLike) -> Storage:
    return job if isinstance(job, Storage) else Storage.at(job)


def load(job: Storage | str | os.PathLike, tracking_uri: str) -> MlflowRunRef | None:
    """The run this job logged to before on the same server, if any."""
    try:
        saved = json.loads(job_storage(job).read_text(RUN_FILE))["mlflow"]
        ref = MlflowRunRef(**saved)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return ref if ref.tracking_uri == tracking_uri else None


def save(job: Storage | str | os.PathLike, ref: MlflowRunRef) -> None:
    """Whole or not at all: a supervisor killed mid-write leaves the old file, never half a new one."""
    job_storage(job).write_text(RUN_FILE, json.dumps({"mlflow": asdict(ref)}, indent=1))
