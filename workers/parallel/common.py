"""Helpers shared by the sharded strategies: global-norm clipping over any mix of
DTensor shards and replicated tensors, and the data-parallel sub-groups of the mesh."""

from __future__ import annotations

import contextlib
import functools
import math

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.placement_types import _StridedShard
from torch.utils.checkpoint import checkpoint

from workers.models.description import ModelDescription, describe_spec_model
from workers.telemetry import ring_allreduce_bytes


def _distinct_copies(t: torch.Tensor) -> int:
    """How many different shards of `t` exist across the mesh it lives on (1 for a plain tensor)."""
    if not isinstance(t, DTensor):
        return 1
    n = 1
    for size, placement in zip(t.device_mesh.shape, t.placements):
        if isinstance(placement, (Shard, _StridedShard)):  # FSDP over TP shards dim 0 "strided"
            n *= size
    return n


def global_grad_norm_clip(model: nn.Module, max_norm: float) -> float | None:
    """Clip by the norm of the whole (logical) gradient, wherever its pieces live.

    Every rank adds |local piece|^2 / (number of ranks holding that same piece);
    one all-reduce over the world then sums each element exactly once. Valid
    whenever all ranks hold all parameters in some form (no pipeline stages).
    On the device, with fused per-tensor norms (in float64) and one host read, the
    returned norm, per step: no host sync per parameter.
    """
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return None
    world = dist.get_world_size()
    pieces = [(g._local_tensor if isinstance(g, DTensor) else g).detach() for g in grads]
    norms = torch.stack(torch._foreach_norm(pieces, 2.0, dtype=torch.float64))
    replicas = torch.tensor([world / _distinct_copies(g) for g in grads], dtype=torch.float64, device=norms.device)
    total = (norms.square() / replicas).sum()
    dist.all_reduce(total)  # a data collective: on the device
    norm = math.sqrt(float(total))
    if math.isfinite(max_norm):
        coef = max_norm / (norm + 1e-6)
        if coef < 1.0:
            torch._foreach_mul_(pieces, coef)
    return norm


HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}


@torch.no_grad()
def average_in_place(tensors: list[torch.Tensor], group, comm) -> None:
    """Replace each tensor by its mean over `group`, in one flat all-reduce (divide, then sum, as DDP does)."""
    world = dist.get_world_size(group)
    flat = torch.cat([t.detach().reshape(-1) for t in tensors]).div_(world)
    comm.launched(ring_allreduce_bytes(flat.numel() * flat.element_size(), world))
    dist.all_reduce(flat, group=group)
    comm.finished()
    offset = 0
    for t in tensors:
        t.copy_(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()


def precision(ctx):
    """16-bit autocast for the forward when `parallel.mixed_precision` asks for it (weights stay fp32;
    fp16's loss scaling is the trainer's, workers/training/loss_scaling.py)."""
    half = HALF.get(ctx.spec.parallel.mixed_precision)
    return torch.autocast(ctx.device.type, dtype=half) if half else contextlib.nullcontext()


def model_description(model: nn.Module, ctx) -> ModelDescription:
    """The blocks and TP plan of this job's model (workers/models/description.py)."""
    return describe_spec_model(model, ctx.spec.model)


def apply_activation_checkpointing(model: nn.Module, ctx) -> None:
    """Recompute each repeated block in backward (`parallel.activation_checkpointing`).

    The block's own forward is wrapped, not the module: parameter names stay those of the full
    model (checkpoints load across layouts), and FSDP's hooks on the block still run outside the
    recomputed region, so it gathers the block's shards once for the recompute and its backward.
    """
    if not ctx.spec.parallel.activation_checkpointing:
        return
    for block in model_description(model, ctx).blocks(model):
        block.forward = _recomputed(block.forward)


def _recomputed(forward):
    @functools.wraps(forward)
    def run(*args, **kwargs):
        if torch.is_grad_enabled():
            return checkpoint(forward, *args, use_reentrant=False, **kwargs)
        return forward(*args, **kwargs)
    return run


@torch.no_grad()
def reduce_partial_grads(model: nn.Module) -> None:
    """Sum gradients left as Partial DTensors (sequence-parallel LayerNorms) so every rank holds the whole."""
    from torch.distributed.tensor import Partial, Replicate

    for p in model.parameters():
        g = p.grad
        if isinstance(g, DTensor) and any(isinstance(pl, Partial) for pl in g.placements):
            p.grad = g.redistribute(placements=[Replicate() if isinstance(pl, Partial) else pl for pl in g.placements])
