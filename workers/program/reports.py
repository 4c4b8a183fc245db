"""A program rank's reports, turned into the step records the supervisor joins (the same records
Trainyard's own loop emits, workers/telemetry.py), with the injected faults that act on reports.

A program says nothing about its compute and communication split: the time between two reports
(or a reported `step_time_s`) is both its step time and the compute time straggler scores use.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from workers.events import RankEvent, RankStep
from workers.spec import JobSpec
from workers.training.faults import FaultInjector

# Reported keys with a column of their own in the job's series; the rest travel under "metrics".
OWN_KEYS = ("loss", "samples_per_s", "tokens_per_s", "step_time_s", "grad_norm", "lr")


class ReportSink:
    def __init__(self, spec: JobSpec, rank: int, job_dir: Path, emit: Callable[[RankEvent], None],
                 stop: threading.Event, crash: Callable[[], None]):
        self.rank, self.emit, self.stop, self.crash = rank, emit, stop, crash
        self.faults = FaultInjector(spec.fault_injection, rank, job_dir)
        self.last_step = 0
        self._last_ts = time.perf_counter()
        self._lock = threading.Lock()

    def report(self, metrics: dict[str, float], step: int | None) -> None:
        with self._lock:
            now = time.perf_counter()
            step = self.last_step + 1 if step is None else step
            interval, self._last_ts, self.last_step = now - self._last_ts, now, step
        step_time = metrics.get("step_time_s", interval)
        record = {
            "step": step, "rank": self.rank, "loss": metrics.get("loss"), "step_time_s": step_time,
            "compute_time_s": step_time, "comm_time_s": 0.0, "samples": 0, "tokens": 0,
            "grad_norm": metrics.get("grad_norm"), "lr": metrics.get("lr"), "comm_bytes": 0,
            "samples_per_s": metrics.get("samples_per_s"), "tokens_per_s": metrics.get("tokens_per_s"),
            "metrics": {k: v for k, v in metrics.items() if k not in OWN_KEYS}, "ts": time.time(),
        }
        self.emit(RankStep(record))
        self._act_on_faults(step, interval)

    def _act_on_faults(self, step: int, interval: float) -> None:
        if self.faults.fires(step, "crash"):
            self.crash()
        if self.faults.fires(step, "hang"):
            self.stop.wait()  # the report never returns: a hung rank, until the group is stopped
        factor = self.faults.slow_factor(step)
        if factor > 1.0:
            time.sleep((factor - 1.0) * interval)
