"""The supervisor's own log, `supervisor.log` beside the ranks' logs: in the job directory on local
storage, shipped in chunks from this node's disk on an object store (workers/storage/log_output.py)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

from workers.storage import Storage
from workers.storage.log_output import open_log

log = logging.getLogger("trainyard.supervisor")
FILE_NAME = "supervisor.log"


@contextmanager
def supervisor_log(job: Storage | str | os.PathLike) -> Iterator[None]:
    out = open_log(job if isinstance(job, Storage) else Storage.at(job), FILE_NAME)
    handler = logging.FileHandler(out.path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield
    finally:
        log.removeHandler(handler)
        handler.close()
        out.close()
