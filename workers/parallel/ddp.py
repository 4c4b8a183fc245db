"""Data parallelism with torch DDP; a communication hook (workers/parallel/compression.py)
meters the all-reduces and optionally compresses them."""

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from workers.parallel.base import (
    ForwardBackward,
    LossFn,
    StrategyContext,
    accumulate,
    adamw,
    local_clip_grad_norm,
)
from workers.parallel.common import global_grad_norm_clip, precision
from workers.parallel.compression import hooks_off_the_autograd_thread, register_comm_hook
from workers.parallel.expert_parallel import reduce_expert_grads, sharded_experts, take_step_bytes
from workers.parallel.parallelize import data_parallel_mesh, parallelize
from workers.parallel.replicas import ReplicaGroup, replicated_over


class DDPStrategy:
    name = "ddp"

    def wrap(self, model: nn.Module, ctx: StrategyContext) -> nn.Module:
        model = parallelize(model, ctx)
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        # Expert shards (parallel.ep) differ between ranks: DDP leaves them, forward_backward reduces them.
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
        register_comm_hook(ddp, ctx)  # plain, fp16/bf16-compressed or PowerSGD (parallel.compression)
        return ddp

    def build_optimizer(self, wrapped: nn.Module, ctx: StrategyContext) -> torch.optim.Optimizer:
        return adamw(wrapped.parameters(), ctx.spec)

    def forward_backward(self, wrapped: nn.Module, micro: list, loss_fn: LossFn,
                         ctx: StrategyContext) -> ForwardBackward:
        with precision(ctx):
            fb = accumulate(wrapped, micro, loss_fn, ctx, wrapped.no_sync)
        if ctx.spec.parallel.ep > 1:  # the step's all-to-all (forward and backward) and the experts' all-reduce
            ctx.comm.logical_bytes += take_step_bytes(wrapped) + reduce_expert_grads(wrapped, ctx)
        return fb

    def clip_grad_norm(self, wrapped: nn.Module, max_norm: float) -> float | None:
        if sharded_experts(wrapped):  # expert shards: the norm sums every shard once over the ranks
            return global_grad_norm_clip(wrapped, max_norm)
        return local_clip_grad_norm(wrapped, max_norm)

    def replica_groups(self, wrapped: nn.Module, ctx: StrategyContext) -> list[ReplicaGroup]:
        sharded = sharded_experts(wrapped)
        experts = {id(p) for p in sharded}
        shared = [p for p in wrapped.parameters() if id(p) not in experts]
        groups = replicated_over(data_parallel_mesh(ctx), shared)  # whole on every dp (x cp) rank
        if sharded:  # each expert shard: on the ranks at the same place of every expert group
            groups += replicated_over(ctx.mesh["dp_mod_ep"], sharded)
        return groups


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
