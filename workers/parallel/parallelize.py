"""The parallelisms inside a data-parallel replica, applied in one fixed order (torchtitan's): tensor
(+ Megatron sequence) parallel, then context parallel, then expert parallel, then activation
checkpointing; the data-parallel step (workers/parallel/data_parallel/: replicate, with DDP, a local all-reduce,
ZeRO-1/2 or local SGD; or shard, FSDP2/HSDP) wraps what this returns. Each is a plain
function over the model's description and the job's one mesh."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from workers.parallel.common import apply_activation_checkpointing, model_description
from workers.parallel.compiled_blocks import compile_blocks
from workers.parallel.context import apply_context_parallel, shard_sequence
from workers.parallel.expert_parallel import apply_expert_parallel
from workers.parallel.mesh import group_mesh
from workers.parallel.tensor_plan import apply_tensor_plan

BatchShard = Callable[[Any, torch.Tensor | None], tuple[Any, torch.Tensor | None]]


def parallelize(model: nn.Module, ctx) -> nn.Module:
    """`model` on the rank's device with tp, cp, ep and activation checkpointing applied as the spec asks."""
    dims = ctx.spec.dims
    model = model.to(ctx.device)
    if dims.tp > 1:
        apply_tensor_plan(model, ctx.mesh["tp"], model_description(model, ctx), ctx.spec.parallel.sequence_parallel)
    if dims.cp > 1:
        cp_mesh = group_mesh(ctx.mesh, dims, "cp")
        assert cp_mesh is not None
        apply_context_parallel(model, model_description(model, ctx), cp_mesh.get_group())
    if dims.ep > 1:
        apply_expert_parallel(model, ctx.mesh["ep"])
    apply_activation_checkpointing(model, ctx)
    compile_blocks(model, ctx)
    return model


def data_parallel_mesh(ctx) -> DeviceMesh:
    """The ranks that hold the same parameters and see different tokens: dp, times cp under context parallelism
    (their gradients are averaged over both: a cp rank's loss is the mean over its equal share of tokens)."""
    key = ctx.spec.dims.mesh_key("dp_cp")
    assert key is not None, "the mesh always has dp"
    return ctx.mesh[key]


def sequence_shard(dims, rank: int) -> BatchShard | None:
    """What a cp rank keeps of a batch: its two chunks of every sequence, inputs and targets alike (the
    targets were shifted before: a chunk's last target is the next chunk's first token). None without cp."""
    if dims.cp == 1:
        return None
    cp_rank = dims.coordinates(rank)["cp"]

    def shard(inputs, targets):
        return (shard_sequence(inputs, 1, cp_rank, dims.cp),
                None if targets is None else shard_sequence(targets, 1, cp_rank, dims.cp))

    return shard
