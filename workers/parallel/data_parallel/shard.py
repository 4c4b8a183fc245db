"""The shard step: the data-parallel step whose ranks hold shards of the parameters, gradients and optimiser
state (ZeRO-3 with FSDP2 `fully_shard`; the options' kind "fsdp", layout "fsdp", HSDP included).

`parallelize` runs first (tp/sp, cp, ep, activation checkpointing, compile); then each repeated block
(workers/models/description.py) becomes its own FSDP unit over the mesh of the options' group (gathered just
before it runs, freed after unless `reshard_after_forward` is false), and the root unit last: it holds the rest
(embeddings, final norm and head) and stays gathered from forward into backward (shard_root.py). Through the
one DeviceMesh:
  - FSDP x TP: the blocks are tensor-parallel over "tp" first, then sharded over dp (x cp);
  - HSDP (`dp_shard` < dp): the options' group is ("dp_replicate", "dp_shard_cp"), a 2-D mesh; gradients
    reduce-scatter inside a shard group and all-reduce across replicas.
Traffic per step with resharding: all-gather forward + all-gather of the blocks in backward + reduce-scatter =
(3 - root share)(K-1)/K x parameter bytes, just under 1.5x DDP; without it, 1.0x.
Expert shards (parallel.ep) are reduced beside it, over the ranks that hold the same shard.
A pipeline (pp x FSDP2, workers/parallel/pipeline/strategy.py) shards each rank's stage with it: its held blocks
(`shard_blocks`) before the stage hooks them, the stage as its root (`shard_root`) after; torch's pipeline stage
drives FSDP's gradient sync (no reduce-scatter until the last micro-batch's backward).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from workers.parallel.base import ForwardBackward, LossFn, StrategyContext, accumulate, adamw
from workers.parallel.common import HALF, global_grad_norm_clip, model_description
from workers.parallel.data_parallel.shard_root import root_reshard_after_forward
from workers.parallel.expert_parallel import reduce_expert_grads, sharded_experts, take_step_bytes
from workers.parallel.layouts.data_parallel_options import DataParallelOptions
from workers.parallel.loop_hooks import NO_HOOKS, LoopHooks
from workers.parallel.metering import metered, metered_calls
from workers.parallel.parallelize import data_parallel_mesh, parallelize
from workers.parallel.replicas import ReplicaGroup, replicated_over
from workers.storage_tracker import GRADS, note_held


def shard_mesh(ctx: StrategyContext, options: DataParallelOptions) -> DeviceMesh:
    """The mesh the step shards over: dp (x cp: context-parallel ranks hold the same parameters, so FSDP shards
    over them too), or HSDP's 2-D (dp_replicate, dp_shard x cp) where the options' group has two parts."""
    dims = ctx.spec.dims
    shard = dims.mesh_key(options.group[-1])
    if len(options.group) == 1 or dims.dp_replicate == 1 or shard is None:
        return data_parallel_mesh(ctx)
    return ctx.mesh[options.group[0], shard]


def shard_blocks(blocks: Iterable[nn.Module], mesh: DeviceMesh, options: DataParallelOptions,
                 ignored: set[nn.Parameter] | None = None) -> None:
    """`fully_shard` each block: one FSDP unit per repeated block."""
    half = HALF.get(options.mixed_precision)
    mp = MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32) if half else MixedPrecisionPolicy()
    for block in blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=options.reshard_after_forward, mp_policy=mp,
                    ignored_params=ignored)


def shard_root(model: nn.Module, mesh: DeviceMesh, options: DataParallelOptions,
               ignored: set[nn.Parameter] | None = None) -> nn.Module:
    """`fully_shard` the root, after its blocks (in place: fully_shard swaps a module's class for an FSDP
    subclass and returns it)."""
    half = HALF.get(options.mixed_precision)
    # fp32 logits: the loss (and fp16's scaled loss, far above 65504) is computed in fp32
    mp = MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32, output_dtype=torch.float32) if half \
        else MixedPrecisionPolicy()
    fully_shard(model, mesh=mesh, reshard_after_forward=root_reshard_after_forward(options.reshard_after_forward),
                mp_policy=mp, ignored_params=ignored)
    return model


class ShardStep:
    name = "fsdp"  # the layout it trains, HSDP included: what `layout.strategy` reports
    hooks: LoopHooks = NO_HOOKS  # nothing beyond the step: the export gathers DTensor shards as by default

    def __init__(self, options: DataParallelOptions | None = None) -> None:
        self.options = options  # from the spec at wrap when the registry builds it bare
        self.dp_mesh: DeviceMesh | None = None

    def wrap(self, model: nn.Module, ctx: StrategyContext) -> nn.Module:
        """`parallelize`, then this step."""
        return self.apply(parallelize(model, ctx), ctx)

    def apply(self, model: nn.Module, ctx: StrategyContext) -> nn.Module:
        self.options = options = self.options or DataParallelOptions.of(ctx.spec)
        self.dp_mesh = shard_mesh(ctx, options)
        # Expert shards (parallel.ep) stay out of FSDP: each ep rank already holds only its own experts, and
        # sharding them again over dp_mod_ep would need FSDP2 over a 2-D (dp_mod_ep, ep) DTensor for little
        # memory (dp_mod_ep is dp / ep). They are reduced as under DDP (reduce_expert_grads).
        experts = set(sharded_experts(model)) or None
        shard_blocks(model_description(model, ctx).blocks(model), self.dp_mesh, options, experts)
        return shard_root(model, self.dp_mesh, options, experts)

    def shard_stage_blocks(self, blocks: Iterable[nn.Module], ctx: StrategyContext) -> None:
        """A pipeline rank's held blocks, each its unit (before its stage registers hooks on them)."""
        self.options = options = self.options or DataParallelOptions.of(ctx.spec)
        self.dp_mesh = shard_mesh(ctx, options)
        shard_blocks(blocks, self.dp_mesh, options)

    def shard_stage(self, stage: nn.Module) -> nn.Module:
        """A pipeline stage as the root unit of its blocks (torch's PipelineStage drives its gradient sync)."""
        assert self.options is not None and self.dp_mesh is not None, "shard_stage_blocks runs first"
        return shard_root(stage, self.dp_mesh, self.options)

    def reduce(self, wrapped: nn.Module, ctx: StrategyContext) -> None:
        """Nothing after a pipeline's schedule: FSDP2 reduce-scattered in the last micro-batch's backward."""

    def build_optimizer(self, wrapped: nn.Module, ctx: StrategyContext) -> torch.optim.Optimizer:
        return adamw(wrapped.parameters(), ctx.spec)

    def replica_groups(self, wrapped: nn.Module, ctx: StrategyContext) -> list[ReplicaGroup]:
        assert self.dp_mesh is not None, "wrap runs before the first step"
        experts = sharded_experts(wrapped)  # each expert shard: on the same place of every expert group
        groups = replicated_over(ctx.mesh["dp_mod_ep"], experts) if experts else []
        if self.dp_mesh.ndim == 1:
            return groups  # fully sharded: every other shard lives on one rank
        return groups + replicated_over(self.dp_mesh["dp_replicate"], wrapped.parameters())  # over replicas

    def forward_backward(self, wrapped: nn.Module, micro: list, loss_fn: LossFn,
                         ctx: StrategyContext) -> ForwardBackward:
        fb = sharded_forward_backward(wrapped, micro, loss_fn, ctx)
        if ctx.spec.parallel.ep > 1:  # the all-to-all (counted by the dispatch) and the experts' all-reduce
            ctx.comm.logical_bytes += take_step_bytes(wrapped) + reduce_expert_grads(wrapped, ctx)
        return fb

    def clip_grad_norm(self, wrapped: nn.Module, max_norm: float) -> float | None:
        return global_grad_norm_clip(wrapped, max_norm)


def sharded_forward_backward(wrapped: nn.Module, micro: list, loss_fn: LossFn,
                             ctx: StrategyContext) -> ForwardBackward:
    """`parallel.fsdp_accumulate`: sharded reduce-scatters every micro-batch's gradients (FSDP2 adds each
    into the sharded `.grad`); unsharded accumulates whole gradients locally and reduce-scatters once, on
    the last micro-batch. Also SDP's, over each subnetwork's shard group."""
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
