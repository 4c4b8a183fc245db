"""Per-step measurements taken inside each rank.

Compute time is the rank's own forward/backward/optimizer work; communication
time is what the step spent blocked on collectives (this includes waiting for
slower peers, which is why straggler scores use compute time, not step time).
Communication bytes are *logical*: what the algorithm must move per rank
(a ring all-reduce of B bytes over K ranks moves 2(K-1)/K x B), not what
gloo's emulation happens to send.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field

import torch
from torch import nn


@dataclass
class StepRecord:
    step: int
    rank: int
    loss: float | None  # None on ranks that compute no loss (e.g. early pipeline stages)
    step_time_s: float
    compute_time_s: float
    comm_time_s: float
    samples: int
    tokens: int
    grad_norm: float | None
    lr: float
    comm_bytes: int
    # parallel.compression: DDP's fp32 ring all-reduce bytes of the gradients the hook compressed (None: none)
    comm_bytes_uncompressed: int | None = None
    model_state_bytes: int | None = None
    # Of comm_bytes, what this rank sent to ranks on other nodes: counted by DDP's hooks from the placement's
    # node map; None where nothing counted it (no node map, or a layout whose collectives do not count it).
    cross_node_bytes: int | None = None
    skipped: bool = False  # the update was skipped (non-finite gradients)
    stage: dict | None = None  # pipeline: this rank's stage accounting (see workers/parallel/pipeline/stage_meter.py)
    # The high-water mark during this step (workers/step_memory.py) and what it held by category
    # (params, grads, optimizer, activations); None on steps the CPU schedule does not measure.
    peak_memory_bytes: int | None = None
    peak_memory_breakdown: dict[str, int] | None = None
    peak_activation_bytes: int | None = None  # the activations' own high-water mark (what recompute lowers)
    peak_flops_per_s: float | None = None  # the worker's peak for MFU (workers/peak_flops.py); None: unknown
    model_params: int | None = None  # the whole model's parameters (counted before sharding), for MFU
    memory_tracked: bool = False  # the CPU storage tracker ran: this step's times include its cost
    # MoE models: the tokens this rank routed to each expert this step, over all MoE layers (None: dense).
    expert_tokens: list[int] | None = None
    ts: float = field(default_factory=time.time)

    def to_dict(self) -> dict:
        return asdict(self)


class CommMeter:
    """Collects bytes and in-flight intervals of the collectives of one step."""

    def __init__(self, clock=None) -> None:
        self._lock = threading.Lock()
        # The step clock (workers/training/step_clock.py): on GPU the last launch is also a CUDA event.
        self.clock = clock
        self.counts_nodes = False  # a hook that knows the node map counts cross_node_bytes
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.logical_bytes = 0
            # What a compressing DDP hook would have sent as DDP's fp32 ring all-reduce (its ratio's baseline).
            self.uncompressed_bytes = 0
            self.cross_node_bytes = 0  # of them, sent to a rank on another node (hooks that know the node map)
            self.last_launch = 0.0
            self.last_launch_mark: object | None = None
            self.last_done = 0.0

    def launched(self, logical_bytes: int, cross_node_bytes: int = 0) -> float:
        now = time.perf_counter()
        mark = self.clock.mark() if self.clock is not None else None
        with self._lock:
            self.logical_bytes += logical_bytes
            self.cross_node_bytes += cross_node_bytes
            if now >= self.last_launch:
                self.last_launch, self.last_launch_mark = now, mark
        return now

    def compressed(self, fp32_bytes: int) -> None:
        """A compressing hook was handed this many fp32 bytes: counted as DDP's ring all-reduce of them."""
        with self._lock:
            self.uncompressed_bytes += fp32_bytes

    def finished(self) -> None:
        now = time.perf_counter()
        with self._lock:
            self.last_done = max(self.last_done, now)


def ring_allreduce_bytes(nbytes: int, world: int) -> int:
    return 0 if world <= 1 else int(2 * (world - 1) * nbytes / world)


def model_state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of parameters, gradients and optimiser state held by this rank (local shards only)."""
    def local(t: torch.Tensor) -> int:
        t = getattr(t, "_local_tensor", t)  # DTensor: count this rank's shard
        return t.numel() * t.element_size()

    params = sum(local(p) for p in model.parameters())
    grads = sum(local(p.grad) for p in model.parameters() if p.grad is not None)
    # ZeRO-2 keeps its gradient shards outside `p.grad`.
    grads += sum(local(g) for g in getattr(optimizer, "sharded_grads", list)())
    opt = sum(local(v) for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0)
    return {"params": params, "grads": grads, "optimizer": opt, "total": params + grads + opt}
