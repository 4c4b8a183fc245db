"""The job's MLflow run, kept in the job directory so that every supervisor of the job continues it.

A restart inside one supervisor keeps its sink; a new supervisor (the control plane replaced a
lost one, or a preempted job admitted again) reads this file and resumes the same run.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

RUN_FILE = "tracking.json"


@dataclass(frozen=True)
class MlflowRunRef:
    tracking_uri: str
    experiment_id: str
    run_id: str
    params_logged: bool = False  # the spec's params went out (they are logged once per run)
    supervisors: int = 1  # supervisors that logged to the run: one more after each supervisor restart or requeue


def load(job_dir: Path, tracking_uri: str) -> MlflowRunRef | None:
    """The run this job logged to before on the same server, if any."""
    try:
        saved = json.loads((job_dir / RUN_FILE).read_text())["mlflow"]
        ref = MlflowRunRef(**saved)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return ref if ref.tracking_uri == tracking_uri else None


def save(job_dir: Path, ref: MlflowRunRef) -> None:
    """Write atomically: a supervisor killed mid-write leaves the old file, never half a new one."""
    job_dir.mkdir(parents=True, exist_ok=True)
    tmp = job_dir / f".{RUN_FILE}.tmp"
    tmp.write_text(json.dumps({"mlflow": asdict(ref)}, indent=1))
    os.replace(tmp, job_dir / RUN_FILE)
