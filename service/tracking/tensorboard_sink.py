"""TensorBoard: event files under <job dir>/tensorboard/, one file per supervisor (and restart).

Series are named as in REST (`loss`, `lr`, ...). A restarted job writes its replayed steps again
into a new file of the same directory; TensorBoard and EventAccumulator read the directory as
one run and keep the newest value of a step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from service.tracking.records import RunTags, StepMetrics, TrackingItem

TENSORBOARD_DIR = "tensorboard"


class TensorBoardSink:
    name = "tensorboard"

    def __init__(self, job_dir: Path):
        self.logdir = job_dir / TENSORBOARD_DIR
        self._writer: Any = None
        self._last_step = 0

    def info(self) -> dict[str, Any]:
        return {"logdir": str(self.logdir)}

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

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
