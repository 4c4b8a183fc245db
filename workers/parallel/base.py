"""The one interface every parallel strategy implements.

A strategy turns the plain model into what this rank runs (wrapped, sharded or
staged), builds the optimiser over this rank's parameters, runs forward and
backward over the rank's micro-batches (owning gradient synchronisation and
accumulation), and clips gradients by the *global* norm. Checkpointing goes
through torch.distributed.checkpoint's get/set_state_dict on `wrapped`, so a
checkpoint written under one layout loads under another.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from workers.model_io import call_model, samples_in, to_device, tokens_in
from workers.parallel.control_group import ControlGroups
from workers.parallel.replicas import ReplicaGroup
from workers.spec import JobSpec, Violation
from workers.telemetry import CommMeter

LossFn = Callable[[Any, torch.Tensor | None], torch.Tensor]  # (model output, targets) -> loss


@dataclass(frozen=True)
class StrategyContext:
    spec: JobSpec
    rank: int
    world_size: int
    mesh: DeviceMesh
    device: torch.device
    comm: CommMeter
    control: ControlGroups  # the CPU groups of control collectives (workers/parallel/control_group.py)


@dataclass
class ForwardBackward:
    loss: float | None  # this rank's mean loss over its micro-batches; None where the rank computes no loss
    samples: int
    tokens: int
    # Optional telemetry a strategy may add (pipeline): communication time it measured itself, and this
    # rank's stage accounting (busy/comm/idle seconds, bubble fraction, activation bytes in flight).
    comm_time_s: float | None = None
    stage: dict | None = None


@dataclass(frozen=True)
class LayoutCost:
    """What the planner predicts for a strategy's layout (workers/parallel/planner.py adds compute, TP traffic
    and the activations of one micro-batch)."""
    model_state_bytes: float  # per rank between steps: fp32 weights 4 + grads 4 + AdamW moments 8 bytes/param, sharded
    dp_comm_bytes: float  # per step: the data-parallel collectives' logical bytes
    # Per rank at the step's peak, when the last micro-batch's backward starts (every activation held): weights,
    # optimiser state, gradients kept from earlier micro-batches, persistent gradient buffers, gathered weights.
    peak_state_bytes: float
    # Per rank on top of that while one repeated block runs its backward (FSDP: its gathered weights, whole
    # gradients and reduce-scatter input); the peak with activation checkpointing, which recomputes a block then.
    block_backward_bytes: float = 0.0
    # Activations at the peak, where the strategy counts them itself (pipeline: micro-batches in flight per
    # schedule); None: one micro-batch through every block (workers/parallel/activations.py).
    activation_bytes: float | None = None


def accumulated_grad_bytes(spec: JobSpec) -> float:
    """Bytes per parameter of whole fp32 gradients held while a later micro-batch runs (none with one)."""
    return 4.0 if spec.grad_accum_steps > 1 else 0.0


def optimizer_state_bytes(spec: JobSpec) -> float:
    """Bytes per parameter of AdamW's moments on the worker's device (offloaded to the host on GPU)."""
    offloaded = spec.parallel.offload_optimizer and spec.resources.gpus_per_worker > 0
    return 0.0 if offloaded else 8.0


def ring(k: int) -> float:
    """Fraction of a buffer one rank sends in a ring all-reduce over k ranks."""
    return 2 * (k - 1) / k if k > 1 else 0.0


def one_pass(k: int) -> float:
    """... in one all-gather or one reduce-scatter."""
    return (k - 1) / k if k > 1 else 0.0


def params_per_rank(spec: JobSpec, facts) -> float:
    """Parameters a rank holds before any data-parallel sharding (tensor parallelism splits its plan's)."""
    return facts.params - facts.tp_params + facts.tp_params / spec.parallel.tp


class Strategy(Protocol):
    """One layout: which specs select it, its own spec rules and cost, and how it trains.

    The registry (workers/parallel/registry.py) asks every strategy for its rules (they check
    its options wherever they appear) and takes the first strategy that selects a spec.
    """

    name: str

    @staticmethod
    def selects(spec: JobSpec) -> bool:
        """Whether this strategy runs the spec's layout (asked in registry order)."""

    @staticmethod
    def spec_errors(spec: JobSpec) -> Iterator[Violation]:
        """Cross-field rules of this strategy's options, each message starting with its field."""

    @staticmethod
    def cost(spec: JobSpec, facts) -> LayoutCost:
        """Model-state bytes per rank and data-parallel bytes per step (facts: workers.parallel.planner.ModelFacts)."""

    def wrap(self, model: nn.Module, ctx: StrategyContext) -> nn.Module:
        """The module this rank trains and checkpoints."""

    def build_optimizer(self, wrapped: nn.Module, ctx: StrategyContext) -> torch.optim.Optimizer:
        """The optimiser over this rank's parameters (or parameter shards)."""

    def forward_backward(self, wrapped: nn.Module, micro: list, loss_fn: LossFn,
                         ctx: StrategyContext) -> ForwardBackward:
        """Accumulate gradients over the micro-batches; gradients are synchronised when it returns."""

    def clip_grad_norm(self, wrapped: nn.Module, max_norm: float) -> float | None:
        """Clip by the global gradient norm and return it."""

    @staticmethod
    def replicas(spec: JobSpec) -> int:
        """How many ranks hold each replicated tensor of the layout (1: nothing is replicated)."""

    def replica_groups(self, wrapped: nn.Module, ctx: StrategyContext) -> list[ReplicaGroup]:
        """What this rank holds that must be bit-identical on other ranks now (workers/parallel/replicas.py)."""


def adamw(params, spec: JobSpec) -> torch.optim.Optimizer:
    # foreach=None, torch's own choice: per-parameter arithmetic on the CPU, the same on every layout and every
    # restart there; multi-tensor kernels on a GPU, as a plain loop's default AdamW (bench/device_throughput.py).
    return torch.optim.AdamW(params, lr=spec.train.lr, weight_decay=spec.train.weight_decay, foreach=None)


def local_clip_grad_norm(wrapped: nn.Module, max_norm: float) -> float | None:
    """Clip when every rank holds whole, identical gradients (data parallel)."""
    params = [p for p in wrapped.parameters() if p.grad is not None]
    if not params:
        return None
    # Multi-tensor kernels on a GPU; per parameter on the CPU (foreach=None would take _foreach_norm there too).
    foreach = None if params[0].device.type == "cuda" else False
    return float(torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=foreach))


def accumulate(wrapped: nn.Module, micro: list, loss_fn: LossFn, ctx: StrategyContext, no_sync) -> ForwardBackward:
    """Forward/backward every micro-batch; `no_sync()` suppresses gradient sync on all but the last."""
    loss_sum, samples, tokens = 0.0, 0, 0
    device, with_labels = ctx.device, ctx.spec.train.loss == "model"
    for i, batch in enumerate(micro):
        inputs, targets = to_device(batch, device)
        last = i == len(micro) - 1
        with no_sync() if not last else contextlib.nullcontext():
            loss = loss_fn(call_model(wrapped, inputs, with_labels), targets) / len(micro)
            loss.backward()
        loss_sum += loss.item()
        samples += samples_in(inputs)
        tokens += tokens_in(inputs)
    return ForwardBackward(loss_sum, samples, tokens)
