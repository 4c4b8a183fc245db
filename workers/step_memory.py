"""Peak memory of a rank during one training step (forward, backward, communication, update), by category.

- CUDA: the allocator's own high-water mark (`reset_peak_memory_stats` before the step,
  `max_memory_allocated` after), every step: it costs nothing. Its breakdown is the parameters, gradients
  and optimiser state held at the end of the step, the rest of the peak being activations and other buffers.
- CPU has no allocator that counts, so a StorageTracker (workers/storage_tracker.py) follows every storage
  the step's ops allocate and free. Its cost is a Python call per op, so it runs on a schedule: the first
  `MEASURED_FIRST_STEPS` steps of each process and every `MEASURE_EVERY`-th step (docs/observability.md gives
  the measured overhead); other steps report no peak. Gradients are what autograd accumulated into `.grad`
  (a post-accumulate-grad hook), ZeRO-2's reduced rows (`on_grad_shards`), DDP's buckets and FSDP's whole
  gradients kept between micro-batches (named by the strategies: storage_tracker.note_lasting / note_held);
  FSDP's reduce-scatter output counts as activations and other buffers.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn

from workers.storage_tracker import (
    ACTIVATIONS,
    GRADS,
    OPTIMIZER,
    PARAMS,
    MemoryPeak,
    StorageTracker,
)
from workers.telemetry import model_state_bytes

MEASURED_FIRST_STEPS = 3  # steps 1..3 of every process (the first update creates the optimiser state)
MEASURE_EVERY = 100  # then steps 100, 200, ...: a measured step costs 1.2-1.4x (docs/observability.md)


class StepMeasurement:
    """What one step's `measuring()` block yields; `peak` is set once the block is left."""

    def __init__(self, tracker: StorageTracker | None = None) -> None:
        self.tracker = tracker
        self.peak: MemoryPeak | None = None

    @contextlib.contextmanager
    def updating(self) -> Iterator[None]:
        """Around the optimiser update: what it allocates is optimiser state (or its temporaries)."""
        if self.tracker is None:
            yield
            return
        self.tracker.category = OPTIMIZER
        try:
            yield
        finally:
            self.tracker.category = ACTIVATIONS


class StepMemory:
    """Measures the steps its schedule picks; `measuring(step)` wraps the step's work."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, device: torch.device,
                 every: int | None = None, first: int | None = None) -> None:
        self.model, self.optimizer, self.device = model, optimizer, device
        # read when built, not when defined: a test shortens the period to cover it in a few steps
        self.every = MEASURE_EVERY if every is None else every
        self.first = MEASURED_FIRST_STEPS if first is None else first
        self.steps_seen = 0
        self.last: MemoryPeak | None = None  # the last measured step's
        self._tracker: StorageTracker | None = None
        if device.type != "cuda":
            for p in model.parameters():
                if p.requires_grad:
                    p.register_post_accumulate_grad_hook(self._grad_accumulated)
            if hasattr(optimizer, "on_grad_shards"):  # ZeRO-2 keeps its reduced gradient rows outside `.grad`
                optimizer.on_grad_shards = self._grads_kept

    def due(self, step: int) -> bool:
        return (self.device.type == "cuda" or self.steps_seen <= self.first
                or (self.every > 0 and step % self.every == 0))

    @contextlib.contextmanager
    def measuring(self, step: int) -> Iterator[StepMeasurement]:
        self.steps_seen += 1
        if not self.due(step):
            yield StepMeasurement()
        elif self.device.type == "cuda":
            yield from self._cuda_peak()
        else:
            yield from self._tracked_peak()

    def _cuda_peak(self) -> Iterator[StepMeasurement]:
        measurement = StepMeasurement()
        torch.cuda.reset_peak_memory_stats(self.device)
        yield measurement
        peak = int(torch.cuda.max_memory_allocated(self.device))
        state = model_state_bytes(self.model, self.optimizer)  # held at the end of the step, grads included
        parts = {PARAMS: state["params"], GRADS: state["grads"], OPTIMIZER: state["optimizer"]}
        breakdown = {**parts, ACTIVATIONS: max(0, peak - sum(parts.values()))}
        measurement.peak = self.last = MemoryPeak(peak, breakdown, breakdown)  # no peak per category on CUDA

    def _tracked_peak(self) -> Iterator[StepMeasurement]:
        tracker = StorageTracker(owner=self.model)
        tracker.register(list(self.model.parameters()) + list(self.model.buffers()), PARAMS)
        tracker.register([p.grad for p in self.model.parameters() if p.grad is not None], GRADS)
        tracker.register([v for s in self.optimizer.state.values() for v in s.values()
                          if torch.is_tensor(v) and v.dim() > 0], OPTIMIZER)
        measurement = StepMeasurement(tracker)
        self._tracker = tracker
        try:
            with tracker:
                yield measurement
        finally:
            self._tracker = None
        measurement.peak = self.last = tracker.peak()

    def _grads_kept(self, tensors: list[torch.Tensor]) -> None:
        if self._tracker is not None:
            for t in tensors:
                self._tracker.classify(t, GRADS)

    def _grad_accumulated(self, p: torch.Tensor) -> None:
        if self._tracker is not None and p.grad is not None:
            self._tracker.classify(p.grad, GRADS)
