"""The supervisor's own log, `logs/supervisor.log` in the job directory, beside the ranks' logs."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger("trainyard.supervisor")


@contextmanager
def supervisor_log(job_dir: Path) -> Iterator[None]:
    path = job_dir / "logs" / "supervisor.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield
    finally:
        log.removeHandler(handler)
        handler.close()
