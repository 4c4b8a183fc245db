"""A node-local directory for what is not job state: a job on an object store has no local job
directory, yet a process may need a place on disk (the log files until they are shipped, a staging
copy of an export before its upload). Nothing read back after a restart lives here."""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

from workers.storage.location import Storage


def local_dir(storage: Storage) -> Path:
    """The job directory itself on local storage; else a per-job directory under the node's temp dir."""
    if storage.is_local:
        return storage.local_path
    digest = hashlib.sha256(storage.uri.encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / "trainyard-scratch" / f"{storage.name}-{digest}"
