"""Injected faults (crash, hang, slow) for testing recovery.

Each fault fires once per job: a crash or hang leaves a marker file under the
job directory before it fires, so the restarted group does not fire it again.
A slow fault persists from its step onward (a degraded node stays degraded).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from workers.spec import FaultSpec


class FaultInjector:
    def __init__(self, faults: list[FaultSpec], rank: int, job_dir: Path):
        self.rank, self.marker_dir = rank, job_dir / "faults"
        self.faults = [(i, f) for i, f in enumerate(faults) if f.rank == rank]

    def _marker(self, index: int) -> Path:
        return self.marker_dir / f"fired-{index}"

    def before_step(self, step: int) -> None:
        """Called with the 1-based step about to run."""
        for index, fault in self.faults:
            if fault.kind == "slow" or fault.at_step != step or self._marker(index).exists():
                continue
            self.marker_dir.mkdir(parents=True, exist_ok=True)
            self._marker(index).write_text(f"{fault.kind} at step {step} on rank {self.rank}\n")
            print(f"[fault-injection] {fault.kind} at step {step} on rank {self.rank}", flush=True)
            if fault.kind == "crash":
                os._exit(17)
            while True:  # hang: the supervisor's hang timeout must notice
                time.sleep(3600)

    def slow_factor(self, step: int) -> float:
        factors = [f.factor for _, f in self.faults if f.kind == "slow" and step >= f.at_step]
        return max(factors, default=1.0)
