"""Where a rank's or a supervisor's log is written, by the job's storage:

- local storage (a directory every node shares): `logs/<name>.log` in the job directory, appended to
  directly, as before (a user can `tail -f` it);
- an object store: a file on this node's own disk, shipped to `logs/<name>/` in chunks by a
  LogShipper (workers/storage/log_shipping.py), which the control plane reads (service/log_tail.py).
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from workers.storage.location import Storage
from workers.storage.log_shipping import LogShipper, ShippingPolicy

LOG_DIR = "logs"
log = logging.getLogger(__name__)


def chunked_log(file_name: str) -> str:
    """`rank-0.log` -> `logs/rank-0`: the log's chunk directory in the job's storage."""
    return f"{LOG_DIR}/{file_name.removesuffix('.log')}"


@dataclass
class LogOutput:
    path: Path  # what the process writes to
    shipper: LogShipper | None  # None on local storage: the path is already the job's log

    def close(self) -> bool:
        """Ship the rest and drop the local copy. A log never fails the job: with the store down this
        warns, keeps the file on this node and returns False."""
        if self.shipper is None:
            return True
        try:
            self.shipper.close()
        except Exception as exc:
            log.warning("shipping %s failed at its end (kept in %s): %s", self.path.name, self.path, exc)
            return False
        shutil.rmtree(self.path.parent, ignore_errors=True)  # shipped: the node keeps nothing of the job
        return True


def open_log(job: Storage, file_name: str, policy: ShippingPolicy = ShippingPolicy()) -> LogOutput:
    if job.is_local:
        path = job.local_path / LOG_DIR / file_name
        path.parent.mkdir(parents=True, exist_ok=True)
        return LogOutput(path, None)
    path = Path(tempfile.mkdtemp(prefix="trainyard-log-")) / file_name  # private to this process
    path.touch()
    return LogOutput(path, LogShipper(path, job, chunked_log(file_name), policy).start())


_captured: LogOutput | None = None  # this process's stdout/stderr (a rank actor's)


def capture_output(job: Storage | str, file_name: str) -> Path:
    """Send this process's stdout and stderr (and its children's) to the job's log `file_name`;
    the local file they go to (a program runner reads its end on a failure)."""
    global _captured
    out = open_log(job if isinstance(job, Storage) else Storage.at(job), file_name)
    fd = os.open(out.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    previous, _captured = _captured, out
    if previous is not None:  # this process was bound before (another attempt): ship the rest of that log
        previous.close()
    return out.path


def end_output() -> None:
    """This process's part of the job is over (its actor is killed next, with no atexit): ship the rest,
    and on an object store leave nothing of the job on this node (later output goes nowhere)."""
    global _captured
    sys.stdout.flush()
    sys.stderr.flush()
    if _captured is None or _captured.shipper is None:  # local storage: the file is the job's log
        return
    if not _captured.close():  # the store is down: output keeps going to the file this node keeps
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)
    _captured = None
