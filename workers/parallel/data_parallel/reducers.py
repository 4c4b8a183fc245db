"""How the replicate step reduces gradients over its group. A pipeline stage's replicas (parallel.pp > 1): one
flat all-reduce of the stage's gradients after the schedule's backward; ZeRO-1/2 (sharded_optimizer.py) and local
SGD (local_sgd.py) by the options' kind; otherwise by the parameters' type: DDP (with its communication hook,
workers/parallel/compression.py) where they are plain tensors, or one all-reduce of each gradient's local
piece where tensor parallelism made them DTensors (DDP does not take DTensors)."""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from workers.parallel.base import StrategyContext, adamw, local_clip_grad_norm
from workers.parallel.common import average_in_place, global_grad_norm_clip, reduce_partial_grads
from workers.parallel.compression import hooks_off_the_autograd_thread, register_comm_hook
from workers.parallel.expert_parallel import sharded_experts
from workers.parallel.layouts.data_parallel_options import DataParallelOptions
from workers.parallel.loop_hooks import NO_HOOKS, LoopHooks
from workers.parallel.parallelize import data_parallel_mesh
from workers.parallel.replicas import local


class GradientReducer(Protocol):
    meters_itself: bool  # its collectives meter their own bytes (DDP's hook); else the step meters them
    hooks: LoopHooks  # what it adds to the loop's fixed points (onebit/signsgd: residuals in checkpoints)

    def wrap(self, model: nn.Module, ctx: StrategyContext) -> nn.Module:
        """The module the rank trains (the model itself where nothing wraps it)."""

    def build_optimizer(self, wrapped: nn.Module, ctx: StrategyContext) -> torch.optim.Optimizer:
        """The optimiser (ZeRO's shards its state and reduces; local SGD's averages the parameters)."""

    def no_sync(self, wrapped: nn.Module) -> AbstractContextManager:
        """Around every micro-batch but the last: no reduction there."""

    def reduce(self, wrapped: nn.Module, ctx: StrategyContext) -> None:
        """After the last micro-batch's backward: gradients averaged over the group."""

    def clip_grad_norm(self, wrapped: nn.Module, max_norm: float) -> float | None:
        """Clip by the global gradient norm and return it."""

    def replicas_identical(self) -> bool:
        """Whether the group's replicas hold the same parameters now (local SGD: only right after an average)."""


def reducer_for(model: nn.Module, options: DataParallelOptions, group=None) -> GradientReducer:
    """A pipeline stage's: the flat all-reduce (over `group` where given, else dp x cp); ZeRO-1/2 and local SGD
    by kind; then DTensor parameters (tensor parallelism) outside the expert shards: the local all-reduce; else
    DDP."""
    from workers.parallel.data_parallel.local_sgd import PeriodicAverage  # they import this module's protocol
    from workers.parallel.data_parallel.sharded_optimizer import ShardedOptimizerReduce

    if options.dims.pp > 1:
        return StageAllReduce(group)
    if options.kind in ("zero1", "zero2"):
        return ShardedOptimizerReduce(stage=1 if options.kind == "zero1" else 2, offload=options.offload_optimizer)
    if options.kind == "local_sgd":
        assert options.local_sgd_period is not None
        return PeriodicAverage(options.local_sgd_period)
    experts = {id(p) for p in sharded_experts(model)}
    if any(isinstance(p, DTensor) for p in model.parameters() if id(p) not in experts):
        return LocalGradientAllReduce()
    return DDPReducer()


class DDPReducer:
    """torch DDP: bucketed all-reduces overlapping the last backward, through the metered comm hook."""

    meters_itself = True
    hooks: LoopHooks = NO_HOOKS

    def wrap(self, model: nn.Module, ctx: StrategyContext) -> nn.Module:
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        # Expert shards (parallel.ep) differ between ranks: DDP leaves them, the step reduces them.
        experts = {id(p) for p in sharded_experts(model)}
        shards = [name for name, p in model.named_parameters() if id(p) in experts]
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, derived_buffers(model) + shards)
        # find_unused_parameters keeps one bucket layout for every step of every attempt: without it the
        # reducer rebuilds its buckets after an attempt's first step, so a resumed run's first step sums
        # gradients in another order (3+ ranks: not bit-identical to the run it resumes). Not under a hook
        # that issues collectives from completion callbacks (PowerSGD): the reducer's all-reduce of its
        # used-parameter map (autograd thread) then raced them on the same group, ranks issued the two
        # in different orders and gloo aborted on the size mismatch (a 4-rank test: "1120 vs 20").
        ddp = DistributedDataParallel(model, device_ids=device_ids,
                                      find_unused_parameters=not hooks_off_the_autograd_thread(ctx.spec))
        self.hooks = register_comm_hook(ddp, ctx)  # plain, fp16/bf16, PowerSGD, onebit or signsgd
        return ddp

    def build_optimizer(self, wrapped: nn.Module, ctx: StrategyContext) -> torch.optim.Optimizer:
        return adamw(wrapped.parameters(), ctx.spec)

    def no_sync(self, wrapped: nn.Module) -> AbstractContextManager:
        assert isinstance(wrapped, DistributedDataParallel)
        return wrapped.no_sync()

    def reduce(self, wrapped: nn.Module, ctx: StrategyContext) -> None:
        pass  # DDP reduced during the last micro-batch's backward

    def clip_grad_norm(self, wrapped: nn.Module, max_norm: float) -> float | None:
        if sharded_experts(wrapped):  # expert shards: the norm sums every shard once over the ranks
            return global_grad_norm_clip(wrapped, max_norm)
        return local_clip_grad_norm(wrapped, max_norm)

    def replicas_identical(self) -> bool:
        return True


class _ReduceAfterBackward:
    """What the reducers that act once after the backward share: nothing wraps the model, AdamW, no
    per-micro-batch state to silence, replicas kept identical."""

    hooks: LoopHooks = NO_HOOKS

    def wrap(self, model: nn.Module, ctx: StrategyContext) -> nn.Module:
        return model

    def build_optimizer(self, wrapped: nn.Module, ctx: StrategyContext) -> torch.optim.Optimizer:
        return adamw(wrapped.parameters(), ctx.spec)

    def no_sync(self, wrapped: nn.Module) -> AbstractContextManager:
        return contextlib.nullcontext()

    def replicas_identical(self) -> bool:
        return True


class LocalGradientAllReduce(_ReduceAfterBackward):
    """Tensor-parallel parameters: partial gradients reduced over tp, then each local piece averaged over the
    data-parallel (x cp) group once per step."""

    meters_itself = False

    def reduce(self, wrapped: nn.Module, ctx: StrategyContext) -> None:
        reduce_partial_grads(wrapped)
        average_over_dp(wrapped, ctx)

    def clip_grad_norm(self, wrapped: nn.Module, max_norm: float) -> float | None:
        return global_grad_norm_clip(wrapped, max_norm)


class StageAllReduce(_ReduceAfterBackward):
    """A pipeline stage's replicas (parallel.pp > 1): the schedule runs forward and backward (every stage's
    micro-batches, no reduction between them); then each gradient's local piece (a tp shard's own) is averaged over
    the stage's replicas in one flat all-reduce. Over dp x cp, or a group the pipeline names (chimera: a stage's
    two copies and their replicas). The pipeline clips: the norm spans its stages."""

    meters_itself = True  # average_in_place meters its all-reduce

    def __init__(self, group=None) -> None:
        self.group = group

    def reduce(self, wrapped: nn.Module, ctx: StrategyContext) -> None:
        group = self.group if self.group is not None else data_parallel_mesh(ctx).get_group()
        if dist.get_world_size(group) == 1:
            return
        average_in_place([local(p.grad) for p in wrapped.parameters() if p.grad is not None], group, ctx.comm)

    def clip_grad_norm(self, wrapped: nn.Module, max_norm: float) -> float | None:
        raise NotImplementedError("a pipeline clips by the norm over all its stages (PipelineStrategy.clip_grad_norm)")


@torch.no_grad()
def average_over_dp(wrapped: nn.Module, ctx: StrategyContext) -> None:
    """Each gradient's local piece averaged over dp (x cp); the expert shards are reduce_expert_grads's."""
    dp_mesh = data_parallel_mesh(ctx)
    if dp_mesh.size() == 1:
        return
    group = dp_mesh.get_group()
    works = []
    experts = {id(p) for p in sharded_experts(wrapped)}
    for p in wrapped.parameters():
        if p.grad is None or id(p) in experts:
            continue
        local = p.grad._local_tensor if isinstance(p.grad, DTensor) else p.grad
        local.div_(dp_mesh.size())
        works.append(dist.all_reduce(local, group=group, async_op=True))
    for w in works:
        w.wait()


def derived_buffers(model: nn.Module) -> list[str]:
    """Buffers kept out of the state dict (`persistent=False`: rotary frequencies, causal masks): each
    rank computes them from the config and training never changes them, so DDP need not broadcast them
    from rank 0 before every forward (a collective per micro-batch). Trained buffers (BatchNorm's
    running statistics) are persistent and still are. Read from each module's own record of them, not
    from the state dict's keys, which a model's state-dict hooks may rename."""
    named = {id(buffer): name for name, buffer in model.named_buffers()}  # the names DDP uses
    return sorted(named[id(buffer)] for module in model.modules()
                  for key in getattr(module, "_non_persistent_buffers_set", ())
                  if (buffer := module._buffers.get(key)) is not None and id(buffer) in named)
