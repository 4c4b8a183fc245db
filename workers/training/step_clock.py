"""The clock a step's phases are timed with, chosen by device type.

On CPU a phase boundary is a host timestamp: the host runs the work, so host time is the work's
time (compute time proper is the thread's CPU time, workers/training/cpu_time.py). On a GPU the host
only queues kernels, so a host timestamp times the launches: a boundary is a CUDA event recorded on
the current stream, and the seconds between two boundaries are read once per step, after the
step's own synchronisation point (the trainer's `torch.cuda.synchronize`), never inside it.
"""

from __future__ import annotations

import time
from typing import Protocol

import torch


class StepClock(Protocol):
    def mark(self) -> object:
        """A phase boundary, now (on GPU: in stream order)."""

    def seconds(self, start: object, end: object) -> float:
        """Seconds between two boundaries; on GPU only after the step's synchronisation point."""


class HostClock:
    def mark(self) -> float:
        return time.perf_counter()

    def seconds(self, start: object, end: object) -> float:
        assert isinstance(start, float) and isinstance(end, float)
        return end - start


class CudaEventClock:
    def __init__(self, device: torch.device) -> None:
        self.device = device

    def mark(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def seconds(self, start: object, end: object) -> float:
        assert isinstance(start, torch.cuda.Event) and isinstance(end, torch.cuda.Event)
        return start.elapsed_time(end) / 1000.0  # milliseconds; both events have completed by now


def clock_for(device: torch.device) -> StepClock:
    return CudaEventClock(device) if device.type == "cuda" else HostClock()
