"""A program rank's reports, turned into the step records the supervisor joins (the same records
Trainyard's own loop emits, workers/telemetry.py), with the injected faults that act on reports.

A program says nothing about its compute and communication split. Straggler scores want each
rank's own work, without the time it waits for its peers: a program that measures it reports it
as `compute_time_s`; otherwise it is the time from the rank's previous report returning to this
one, which in a lockstep loop (every step ends in a collective) includes waiting for the slowest
rank, so only such a report lets the supervisor tell which rank is slow.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from workers.events import RankEvent, RankStep
from workers.spec import JobSpec
from workers.storage import Storage
from workers.training.faults import FaultInjector

# Reported keys with a column of their own in the job's series; the rest travel under "metrics".
OWN_KEYS = ("loss", "samples_per_s", "tokens_per_s", "step_time_s", "compute_time_s", "grad_norm", "lr")


class ReportSink:
    def __init__(self, spec: JobSpec, rank: int, job: Storage, emit: Callable[[RankEvent], None],
                 stop: threading.Event, crash: Callable[[], None]):
        self.rank, self.emit, self.stop, self.crash = rank, emit, stop, crash
        self.faults = FaultInjector(spec.fault_injection, rank, job)
        self.last_step = 0
        self._last_report = self._last_return = time.perf_counter()
        self._lock = threading.Lock()

    def report(self, metrics: dict[str, float], step: int | None, wall_s: float | None = None,
               own_s: float | None = None) -> None:
        """wall_s and own_s: the rank's own timing where it measured it (a command rank's batched reports
        arrive together, trainyard/channel.py); else the time between this sink's calls."""
        with self._lock:
            now = time.perf_counter()
            step = self.last_step + 1 if step is None else step
            wall = now - self._last_report if wall_s is None else wall_s
            own = now - self._last_return if own_s is None else own_s
            self._last_report, self.last_step = now, step
        # An injected `slow` fault makes this rank's own work `factor` times longer (held here).
        factor = self.faults.slow_factor(step)
        compute = metrics.get("compute_time_s", own)
        record = {
            "step": step, "rank": self.rank, "loss": metrics.get("loss"),
            "step_time_s": metrics.get("step_time_s", wall), "compute_time_s": compute * factor, "comm_time_s": 0.0,
            "samples": 0, "tokens": 0, "grad_norm": metrics.get("grad_norm"), "lr": metrics.get("lr"),
            "comm_bytes": 0, "samples_per_s": metrics.get("samples_per_s"),
            "tokens_per_s": metrics.get("tokens_per_s"),
            "metrics": {k: v for k, v in metrics.items() if k not in OWN_KEYS}, "ts": time.time(),
        }
        self.emit(RankStep(record))
        if self.faults.fires(step, "crash"):
            self.crash()
        if self.faults.fires(step, "hang"):
            self.stop.wait()  # the report never returns: a hung rank, until the group is stopped
        if factor > 1.0:
            time.sleep((factor - 1.0) * compute)
        self._last_return = time.perf_counter()
