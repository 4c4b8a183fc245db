"""TensorBoard: event files under <job>/tensorboard/, one file per supervisor (and restart).

Series are named as in REST (`loss`, `lr`, ...). A restarted job writes its replayed steps again
into a new file of the same directory; TensorBoard and EventAccumulator read the directory as
one run and keep the newest value of a step. On an object store the writer (which cannot write to
s3:// without TensorFlow) writes to this node's disk, and the event files are copied to the store
every UPLOAD_EVERY_S and at close; a file is rewritten whole (scalars: a few hundred KB at most).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from service.tracking.records import RunTags, StepMetrics, TrackingItem
from service.tracking.run_file import job_storage
from workers.storage import Storage

TENSORBOARD_DIR = "tensorboard"
UPLOAD_EVERY_S = 10.0


class TensorBoardSink:
    name = "tensorboard"

    def __init__(self, job: Storage | str | os.PathLike):
        self.store = job_storage(job) / TENSORBOARD_DIR
        local = self.store.is_local
        self.logdir = self.store.local_path if local else Path(tempfile.mkdtemp(prefix="trainyard-tensorboard-"))
        self._writer: Any = None
        self._last_step = 0
        self._uploaded = 0.0 if local else -UPLOAD_EVERY_S  # monotonic time of the last upload

    def info(self) -> dict[str, Any]:
        return {"logdir": self.store.uri}

    def send(self, batch: list[TrackingItem]) -> None:
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

            self.logdir.mkdir(parents=True, exist_ok=True)
            self._writer = SummaryWriter(log_dir=str(self.logdir))
        writer = self._writer
        for item in batch:
            if isinstance(item, StepMetrics):
                self._last_step = item.step
                for name, value in item.values.items():
                    writer.add_scalar(name, value, item.step, walltime=item.ts_ms / 1000 or None)
            elif isinstance(item, RunTags):
                text = "  \n".join(f"**{k}**: {v}" for k, v in sorted(item.tags.items()))
                writer.add_text("trainyard", text, self._last_step)
        writer.flush()
        if not self.store.is_local and time.monotonic() - self._uploaded >= UPLOAD_EVERY_S:
            self._upload()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if not self.store.is_local:
            self._upload()
            shutil.rmtree(self.logdir, ignore_errors=True)

    def _upload(self) -> None:
        self._uploaded = time.monotonic()
        for path in sorted(self.logdir.glob("events.*")):
            self.store.upload(path, path.name)
