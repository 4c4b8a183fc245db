"""Injected faults for testing recovery: crash, hang, slow, nan (poisoned loss), bitflip.

Each fault but `slow` fires once per job: it leaves a marker file under the job
directory before it fires, so a restarted group does not fire it again. A slow
fault persists from its step onward (a degraded node stays degraded).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch
from torch import nn

from workers.spec import FaultSpec


class FaultInjector:
    def __init__(self, faults: list[FaultSpec], rank: int, job_dir: Path):
        self.rank, self.marker_dir = rank, job_dir / "faults"
        self.faults = [(i, f) for i, f in enumerate(faults) if f.rank == rank]

    def _marker(self, index: int) -> Path:
        return self.marker_dir / f"fired-{index}"

    def fires(self, step: int, kind: str) -> bool:
        """True (once) when a fault of `kind` is due at this 1-based step on this rank."""
        for index, fault in self.faults:
            if fault.kind == kind and fault.at_step == step and not self._marker(index).exists():
                self.marker_dir.mkdir(parents=True, exist_ok=True)
                self._marker(index).write_text(f"{kind} at step {step} on rank {self.rank}\n")
                print(f"[fault-injection] {kind} at step {step} on rank {self.rank}", flush=True)
                return True
        return False

    def before_step(self, step: int) -> None:
        """Called with the 1-based step about to run."""
        if self.fires(step, "crash"):
            os._exit(17)
        if self.fires(step, "hang"):
            while True:  # the supervisor's hang timeout must notice
                time.sleep(3600)

    def slow_factor(self, step: int) -> float:
        factors = [f.factor for _, f in self.faults if f.kind == "slow" and step >= f.at_step]
        return max(factors, default=1.0)

    def flip_a_bit(self, step: int, model: nn.Module) -> None:
        """Silent data corruption: flip one mantissa bit of one parameter on this replica only."""
        if self.fires(step, "bitflip"):
            with torch.no_grad():
                param = next(p for p in model.parameters() if p.dtype == torch.float32)
                local = getattr(param, "_local_tensor", param)
                local.view(-1)[:1].view(torch.int32).bitwise_xor_(1 << 12)
