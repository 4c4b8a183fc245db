"""The one interface every parallel strategy implements.

A strategy turns the plain model into what this rank runs (wrapped, sharded or
staged), builds the optimiser over this rank's parameters, runs forward and
backward over the rank's micro-batches (owning gradient synchronisation and
accumulation), and clips gradients by the *global* norm. What it adds at the
loop's other fixed points it declares as typed hooks (loop_hooks.py). Checkpointing goes
through torch.distributed.checkpoint's get/set_state_dict on `wrapped`, so a
checkpoint written under one layout loads under another.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from workers.model_io import call_model, samples_in, to_device, tokens_in
from workers.parallel.control_group import ControlGroups
from workers.parallel.loop_hooks import LoopHooks
from workers.parallel.replicas import ReplicaGroup
from workers.spec import JobSpec
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
    # The placement's node map: the node id of every rank, in rank order (workers/runtime/group.py); empty
    # where the ranks were not placed by Ray (tests, the device check): one machine.
    nodes: tuple[str, ...] = ()
    # A rank that joins a running job alone (the parameter server's async trainers: an elastic join), in a
    # process group of its own: no collective with the others, and no mesh (`mesh` is None then).
    joining: bool = False


@dataclass
class ForwardBackward:
    loss: float | None  # this rank's mean loss over its micro-batches; None where the rank computes no loss
    samples: int
    tokens: int
    # Optional telemetry a strategy may add (pipeline): communication time it measured itself, and this
    # rank's stage accounting (busy/comm/idle seconds, bubble fraction, activation bytes in flight).
    comm_time_s: float | None = None
    stage: dict | None = None


class Strategy(Protocol):
    """How one layout trains. Which specs it runs, its options' rules and its cost are torch-free, in its
    layout (workers/parallel/layouts/); the registry (workers/parallel/registry.py) finds it by name."""

    name: str

    def wrap(self, model: nn.Module, ctx: StrategyContext) -> nn.Module:
        """The module this rank trains and checkpoints."""

    def build_optimizer(self, wrapped: nn.Module, ctx: StrategyContext) -> torch.optim.Optimizer:
        """The optimiser over this rank's parameters (or parameter shards)."""

    def forward_backward(self, wrapped: nn.Module, micro: list, loss_fn: LossFn,
                         ctx: StrategyContext) -> ForwardBackward:
        """Accumulate gradients over the micro-batches; gradients are synchronised when it returns."""

    def clip_grad_norm(self, wrapped: nn.Module, max_norm: float) -> float | None:
        """Clip by the global gradient norm and return it."""

    def replica_groups(self, wrapped: nn.Module, ctx: StrategyContext) -> list[ReplicaGroup]:
        """What this rank holds that must be bit-identical on other ranks now (workers/parallel/replicas.py)."""

    @property
    def hooks(self) -> LoopHooks:
        """The loop's fixed points it takes part in beyond a step (workers/parallel/loop_hooks.py): checkpoint
        save and load, the model validation runs, the exported state, what step records and the final result
        add. `NO_HOOKS` where it takes part in none: the loop calls every hook, whatever the strategy."""


def adamw(params, spec: JobSpec) -> torch.optim.Optimizer:
    # foreach=None, torch's own choice: per-parameter arithmetic on the CPU, the same on every layout and every
    # restart there; multi-tensor kernels on a GPU, as a plain loop's default AdamW (bench/device_throughput.py).
    return torch.optim.AdamW(params, lr=spec.train.lr, weight_decay=spec.train.weight_decay, foreach=None)


def local_clip_grad_norm(wrapped: nn.Module, max_norm: float) -> float | None:
    """Clip when every rank holds whole, identical gradients (data parallel)."""
    return clip_grads_(list(wrapped.parameters()), max_norm)


def clip_grads_(tensors: list[torch.Tensor], max_norm: float) -> float | None:
    """Scale the gradients of `tensors` to a global norm of at most `max_norm`; their norm before (None:
    no gradients)."""
    params = [p for p in tensors if p.grad is not None]
    if not params:
        return None
    # Multi-tensor kernels on a GPU; per parameter on the CPU (foreach=None would take _foreach_norm there too).
    foreach = None if params[0].device.type == "cuda" else False
    return float(torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=foreach))


def accumulate(wrapped: nn.Module, micro: list, loss_fn: LossFn, ctx: StrategyContext, no_sync) -> ForwardBackward:
    """Forward/backward every micro-batch; `no_sync()` suppresses gradient sync on all but the last."""
    from workers.parallel.context.ring import take_ring_bytes
    from workers.parallel.parallelize import sequence_shard  # the strategies import this module

    loss_sum, samples, tokens = 0.0, 0, 0
    device, with_labels = ctx.device, ctx.spec.train.loss == "model"
    shard = sequence_shard(ctx.spec.dims, ctx.rank)
    counts_tokens = ctx.spec.dims.coordinates(ctx.rank)["tp"] == 0  # tp peers see the same tokens: count them once
    for i, batch in enumerate(micro):
        inputs, targets = to_device(batch, device)
        if shard is not None:  # context parallelism: this rank's chunks of every sequence
            inputs, targets = shard(inputs, targets)
        last = i == len(micro) - 1
        with no_sync() if not last else contextlib.nullcontext():
            loss = loss_fn(call_model(wrapped, inputs, with_labels), targets) / len(micro)
            loss.backward()
        loss_sum += loss.item()
        samples += samples_in(inputs)
        tokens += tokens_in(inputs) if counts_tokens else 0
    if shard is not None:  # what attention sent around the cp ring, forward and backward
        ctx.comm.logical_bytes += take_ring_bytes()
    return ForwardBackward(loss_sum, samples, tokens)
