"""Pipeline auto-rebalancing: a small policy the supervisor applies at the next durable checkpoint.

When `parallel.pipeline.rebalance_threshold` is set, the per-stage busy times of the
last `window` steps are compared; if the slowest stage's median exceeds the fastest's
by more than the threshold, the blocks are re-split by measured cost and the group
restarts from the next checkpoint with that split pinned (once per job: measured
costs after a move are noisier than the imbalance it fixed). Checkpoints reshard
because stage parameters keep the full model's names.
"""

from __future__ import annotations

import statistics
from collections import deque

from workers.parallel.pipeline.split import rebalanced_split
from workers.spec import JobSpec
from workers.spec_checks import checked_spec


class PipelineRebalancer:
    def __init__(self, spec: JobSpec, window: int = 5):
        pipe = spec.parallel.pipeline
        self.threshold = pipe.rebalance_threshold if pipe is not None and spec.parallel.pp > 1 else None
        self.window: deque[list[float]] = deque(maxlen=window)
        self.planned: tuple[list[int], list[float]] | None = None  # (new split, median busy per stage)
        self.done = False

    def observe(self, spec: JobSpec, record: dict) -> None:
        if self.threshold is None or self.done or self.planned is not None or "stages" not in record:
            return
        self.window.append([s["busy_s"] for s in record["stages"]])
        if len(self.window) < (self.window.maxlen or 1):
            return
        busy = [statistics.median(step[i] for step in self.window) for i in range(len(self.window[0]))]
        split = rebalanced_split(spec, busy, self.threshold)
        if split is not None:
            self.planned = (split, busy)

    def take(self, spec: JobSpec, durable_step: int) -> tuple[JobSpec, str, dict] | None:
        """The re-split spec to restart with from the checkpoint at `durable_step`, once planned."""
        if self.planned is None:
            return None
        split, busy = self.planned
        self.planned, self.done = None, True
        data = spec.model_dump(mode="json")
        data["parallel"]["pipeline"] = {**(data["parallel"].get("pipeline") or {}), "split": split}
        new_spec = checked_spec(data, allow_fault_injection=True)  # fault injection was admitted at submit
        busy_text = ", ".join(f"{b * 1e3:.1f}" for b in busy)
        reason = (f"pipeline stages unbalanced (busy ms per stage: {busy_text}); re-split blocks to {split} "
                  f"from the checkpoint at step {durable_step}")
        return new_spec, reason, {"split": split, "stage_busy_s": busy, "step": durable_step}
