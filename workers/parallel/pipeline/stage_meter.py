"""One rank's pipeline bubble, measured (the theory is in bubble.py).

Measurement wraps the torch stage's compute calls (forward + loss, full or
input-gradient backward, weight-gradient backward) and the schedule's p2p
issue/wait calls. Time blocked in p2p is split into communication (what the
transfer itself costs: each call counted up to the quickest wait of the step,
a wait whose data was already there) and idle (waiting for the neighbour
stage). The ranks of a pipeline start the step together (a barrier), and wall
is the pipeline's makespan (its slowest rank's time in the schedule); a rank
that finishes early idles for the rest of it. bubble_fraction = idle / wall.
Activations in flight are the bytes autograd saved for backward in forwards
whose backward (weight-gradient, where split) has not yet run; parameters are
not counted.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch.distributed.pipelining import schedules as torch_schedules


@dataclass
class StageTimes:
    forward_s: float = 0.0
    backward_s: float = 0.0  # full backward, or the input-gradient half where split
    weight_grad_s: float = 0.0
    p2p_calls: list[tuple[float, bool]] = field(default_factory=list)  # (seconds, is a wait)
    wall_s: float = 0.0
    activation_bytes_peak: int = 0
    activation_microbatches_peak: int = 0

    @property
    def busy_s(self) -> float:
        return self.forward_s + self.backward_s + self.weight_grad_s

    def comm_and_idle(self) -> tuple[float, float]:
        waits = [d for d, is_wait in self.p2p_calls if is_wait]
        floor = min(waits) if waits else 0.0
        comm = sum(d if not is_wait else min(d, floor) for d, is_wait in self.p2p_calls)
        blocked = sum(d for d, _ in self.p2p_calls)
        return comm, blocked - comm

    def report(self, stage: int, theoretical: float, makespan_s: float | None = None) -> dict:
        """`makespan_s`: the flush's wall time over the whole pipeline (slowest stage, starts aligned by a
        barrier). A stage that finishes early idles until the pipeline does, as the formulas count it."""
        comm, idle = self.comm_and_idle()
        wall = max(makespan_s or 0.0, self.wall_s)
        idle += wall - self.wall_s
        return {
            "stage": stage,
            "busy_s": self.busy_s,
            "forward_s": self.forward_s,
            "backward_s": self.backward_s,
            "weight_grad_s": self.weight_grad_s,
            "comm_s": comm,
            "idle_s": idle,
            "other_s": max(0.0, wall - self.busy_s - comm - idle),
            "wall_s": wall,
            "bubble_fraction": idle / wall if wall > 0 else 0.0,
            "bubble_fraction_theoretical": theoretical,
            "activation_bytes_peak": self.activation_bytes_peak,
            "activation_microbatches_peak": self.activation_microbatches_peak,
        }


@contextlib.contextmanager
def saved_activation_bytes(param_storages: set[int]) -> Iterator[dict[int, int]]:
    """What autograd saves for backward inside the block, by storage (the parameters' storages apart):
    the activations a forward leaves in flight until its backward."""
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor):
        try:
            storage = getattr(t, "_local_tensor", t).untyped_storage()  # DTensor: this rank's piece
            key = storage.data_ptr()
        except RuntimeError:  # a wrapper without storage of its own (inside DTensor dispatch)
            return t
        if key not in param_storages:
            saved[key] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield saved


class StageMeter:
    """Instruments one rank's torch PipelineStages and schedule for the duration of a step."""

    def __init__(self, stages: list, schedule, param_storages: set[int]):
        self.times = StageTimes()
        self._param_storages = param_storages
        self._in_flight: dict[tuple[int, int], int] = {}
        self._p2p_depth = 0
        for stage in stages:
            self._wrap_stage(stage)
        compute_loss = schedule._compute_loss

        def timed_loss(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return compute_loss(*args, **kwargs)
            finally:
                self.times.forward_s += time.perf_counter() - t0

        schedule._compute_loss = timed_loss

    def reset(self) -> None:
        self.times = StageTimes()
        self._in_flight.clear()

    # --- compute -----------------------------------------------------------

    def _wrap_stage(self, stage) -> None:
        forward, backward, weight = stage.forward_one_chunk, stage.backward_one_chunk, stage.backward_weight_one_chunk
        index = stage.stage_index

        def forward_one_chunk(chunk_id, *args, **kwargs):
            t0 = time.perf_counter()
            with saved_activation_bytes(self._param_storages) as saved:
                out = forward(chunk_id, *args, **kwargs)
            self.times.forward_s += time.perf_counter() - t0
            if torch.is_grad_enabled() and stage.has_backward:
                self._in_flight[(index, chunk_id)] = sum(saved.values())
                self._note_peak()
            return out

        def backward_one_chunk(chunk_id, *args, **kwargs):
            full = kwargs.get("full_backward", args[1] if len(args) > 1 else True)
            t0 = time.perf_counter()
            out = backward(chunk_id, *args, **kwargs)
            self.times.backward_s += time.perf_counter() - t0
            if full:
                self._in_flight.pop((index, chunk_id), None)
            return out

        def backward_weight_one_chunk(chunk_id, *args, **kwargs):
            t0 = time.perf_counter()
            out = weight(chunk_id, *args, **kwargs)
            self.times.weight_grad_s += time.perf_counter() - t0
            self._in_flight.pop((index, chunk_id), None)
            return out

        stage.forward_one_chunk = forward_one_chunk
        stage.backward_one_chunk = backward_one_chunk
        stage.backward_weight_one_chunk = backward_weight_one_chunk

    def _note_peak(self) -> None:
        t = self.times
        t.activation_bytes_peak = max(t.activation_bytes_peak, sum(self._in_flight.values()))
        t.activation_microbatches_peak = max(t.activation_microbatches_peak, len(self._in_flight))

    # --- communication -----------------------------------------------------

    def _timed_p2p(self, fn, is_wait: bool):
        def timed(*args, **kwargs):
            self._p2p_depth += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._p2p_depth -= 1
                if self._p2p_depth == 0:  # _sorted_batch_p2p calls _batch_p2p: count the outer call only
                    self.times.p2p_calls.append((time.perf_counter() - t0, is_wait))
        return timed

    @contextlib.contextmanager
    def measuring(self):
        """Time the p2p calls of the schedules module (each rank is its own process, one step at a time)."""
        names = {"_batch_p2p": False, "_sorted_batch_p2p": False, "_wait_batch_p2p": True}
        originals = {n: getattr(torch_schedules, n) for n in names}
        for name, is_wait in names.items():
            setattr(torch_schedules, name, self._timed_p2p(originals[name], is_wait))
        t0 = time.perf_counter()
        try:
            yield self.times
        finally:
            self.times.wall_s += time.perf_counter() - t0
            for name, fn in originals.items():
                setattr(torch_schedules, name, fn)
