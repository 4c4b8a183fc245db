"""ZeRO-3 with FSDP2 `fully_shard`: parameters, gradients and optimiser state sharded.

Each repeated block (workers/models/description.py) is its own FSDP unit (gathered just before it runs, freed after
unless `reshard_after_forward` is false), the root unit holds the rest
(embeddings, final norm and head) and stays gathered from forward into backward. Compositions through the DeviceMesh:
  - FSDP x TP: the blocks are tensor-parallel over "tp" first, then sharded over "dp";
  - HSDP (`dp_shard` < dp): replicate x shard, a 2-D data-parallel mesh
    ("dp_replicate", "dp_shard"); gradients reduce-scatter inside a shard group
    and all-reduce across replicas.
Traffic per step with resharding: all-gather forward + all-gather of the blocks
in backward + reduce-scatter = (3 - root share)(K-1)/K x parameter bytes, just
under 1.5x DDP; without it, 1.0x.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from workers.parallel.base import (
    ForwardBackward,
    LossFn,
    StrategyContext,
    accumulate,
    adamw,
)
from workers.parallel.common import (
    HALF,
    global_grad_norm_clip,
    model_description,
)
from workers.parallel.expert_parallel import reduce_expert_grads, sharded_experts, take_step_bytes
from workers.parallel.fsdp_root import root_reshard_after_forward
from workers.parallel.loop_hooks import NO_HOOKS, LoopHooks
from workers.parallel.metering import metered, metered_calls
from workers.parallel.parallelize import data_parallel_mesh, parallelize
from workers.parallel.replicas import ReplicaGroup, replicated_over
from workers.storage_tracker import GRADS, note_held


def fsdp_meshes(ctx: StrategyContext) -> tuple[DeviceMesh, DeviceMesh]:
    """(the data-parallel mesh FSDP shards over, the tensor-parallel mesh), from one parent mesh."""
    dims = ctx.spec.dims
    shard = dims.mesh_key("dp_shard_cp")  # context-parallel ranks hold the same parameters: FSDP shards over them too
    if dims.dp_replicate == 1 or shard is None:
        return data_parallel_mesh(ctx), ctx.mesh["tp"]
    return ctx.mesh["dp_replicate", shard], ctx.mesh["tp"]


class FSDPStrategy:
    name = "fsdp"
    hooks: LoopHooks = NO_HOOKS  # nothing beyond the step: the export gathers DTensor shards as by default

    def wrap(self, model: nn.Module, ctx: StrategyContext) -> nn.Module:
        p = ctx.spec.parallel
        dp_mesh, _ = fsdp_meshes(ctx)
        self.dp_mesh = dp_mesh
        model = parallelize(model, ctx)
        # Expert shards (parallel.ep) stay out of FSDP: each ep rank already holds only its own experts, and
        # sharding them again over dp_mod_ep would need FSDP2 over a 2-D (dp_mod_ep, ep) DTensor for little
        # memory (dp_mod_ep is dp / ep). They are reduced as under DDP (reduce_expert_grads).
        experts = set(sharded_experts(model)) or None
        half = HALF.get(p.mixed_precision)
        mp = MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32) if half else MixedPrecisionPolicy()
        for block in model_description(model, ctx).blocks(model):  # one FSDP unit per repeated block
            fully_shard(block, mesh=dp_mesh, reshard_after_forward=p.reshard_after_forward, mp_policy=mp,
                        ignored_params=experts)
        # fp32 logits: the loss (and fp16's scaled loss, far above 65504) is computed in fp32
        root_mp = MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32, output_dtype=torch.float32)
        # in place: fully_shard returns the module it was given, its class swapped for an FSDP subclass
        fully_shard(model, mesh=dp_mesh, reshard_after_forward=root_reshard_after_forward(p.reshard_after_forward),
                    mp_policy=root_mp if half else mp, ignored_params=experts)
        return model

    def build_optimizer(self, wrapped: nn.Module, ctx: StrategyContext) -> torch.optim.Optimizer:
        return adamw(wrapped.parameters(), ctx.spec)

    def replica_groups(self, wrapped: nn.Module, ctx: StrategyContext) -> list[ReplicaGroup]:
        experts = sharded_experts(wrapped)  # each expert shard: on the same place of every expert group
        groups = replicated_over(ctx.mesh["dp_mod_ep"], experts) if experts else []
        if self.dp_mesh.ndim == 1:
            return groups  # fully sharded: every other shard lives on one rank
        return groups + replicated_over(self.dp_mesh["dp_replicate"], wrapped.parameters())  # over replicas

    def forward_backward(self, wrapped: nn.Module, micro: list, loss_fn: LossFn,
                         ctx: StrategyContext) -> ForwardBackward:
        fb = fsdp_forward_backward(wrapped, micro, loss_fn, ctx)
        if ctx.spec.parallel.ep > 1:  # the all-to-all (counted by the dispatch) and the experts' all-reduce
            ctx.comm.logical_bytes += take_step_bytes(wrapped) + reduce_expert_grads(wrapped, ctx)
        return fb

    def clip_grad_norm(self, wrapped: nn.Module, max_norm: float) -> float | None:
        return global_grad_norm_clip(wrapped, max_norm)


def fsdp_forward_backward(wrapped: nn.Module, micro: list, loss_fn: LossFn, ctx: StrategyContext) -> ForwardBackward:
    """`parallel.fsdp_accumulate`: sharded reduce-scatters every micro-batch's gradients (FSDP2 adds each
    into the sharded `.grad`); unsharded accumulates whole gradients locally and reduce-scatters once, on
    the last micro-batch."""
    @contextlib.contextmanager
    def no_sync():
        wrapped.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            wrapped.set_requires_gradient_sync(True)

    @contextlib.contextmanager
    def unsharded():
        with no_sync():
            yield
        note_held(unsharded_grads(wrapped), GRADS)  # kept whole until the last micro-batch: peak memory says so

    between = contextlib.nullcontext if ctx.spec.parallel.fsdp_accumulate == "sharded" else unsharded
    # With TP inside, DTensor's functional collectives need the dispatch mode; FSDP alone calls dist.*.
    meter = metered(ctx.comm) if ctx.spec.parallel.tp > 1 else metered_calls(ctx.comm)
    with meter:
        return accumulate(wrapped, micro, loss_fn, ctx, between)


def unsharded_grads(wrapped: nn.Module) -> list[torch.Tensor]:
    """The whole gradients FSDP2 accumulates between reduce-scatters (its FSDPParams' own, upcast to the
    reduce dtype under mixed precision, else on the gathered parameter)."""
    out = []
    for module in wrapped.modules():
        get_state = getattr(module, "_get_fsdp_state", None)
        state = get_state() if callable(get_state) else None
        group = getattr(state, "_fsdp_param_group", None)
        for fsdp_param in getattr(group, "fsdp_params", ()):
            grad = fsdp_param.unsharded_accumulated_grad
            if grad is None:
                grad = fsdp_param._unsharded_param.grad
            if grad is not None:
                out.append(grad)
    return out
