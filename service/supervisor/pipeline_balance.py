"""The window of per-stage busy times the pipeline re-split policy judges (policies/pipeline_resplit.py)."""

from __future__ import annotations

import statistics
from collections import deque

from service.supervisor.policies.pipeline_resplit import PipelineStatus, ResplitDecision, on_stage_times, resplit_spec
from workers.events import PipelineRebalanceEvent
from workers.spec import JobSpec


class PipelineRebalancer:
    def __init__(self, spec: JobSpec, window: int = 5):
        pipe = spec.parallel.pipeline
        self.threshold = pipe.rebalance_threshold if pipe is not None and spec.parallel.pp > 1 else None
        self.window: deque[list[float]] = deque(maxlen=window)
        self.planned: ResplitDecision | None = None
        self.done = False

    def observe(self, spec: JobSpec, record: dict) -> None:
        if self.threshold is None or self.planned is not None or "stages" not in record:
            return
        self.window.append([s["busy_s"] for s in record["stages"]])
        if len(self.window) < (self.window.maxlen or 1):
            return
        busy = tuple(statistics.median(step[i] for step in self.window) for i in range(len(self.window[0])))
        self.planned = on_stage_times(PipelineStatus(spec, busy, self.threshold, already_resplit=self.done))

    def take(self, spec: JobSpec, durable_step: int) -> tuple[JobSpec, PipelineRebalanceEvent] | None:
        """The re-split spec to restart with from the checkpoint at `durable_step`, once planned."""
        if self.planned is None:
            return None
        planned, self.planned, self.done = self.planned, None, True
        return resplit_spec(spec, planned.split), PipelineRebalanceEvent(planned.split, planned.stage_busy_s,
                                                                          durable_step)
