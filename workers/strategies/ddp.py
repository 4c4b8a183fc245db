"""Data parallelism with torch DDP; a communication hook (workers/strategies/compression.py)
meters the all-reduces and optionally compresses them."""

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from workers.strategies.base import (
    ForwardBackward,
    LossFn,
    StrategyContext,
    accumulate,
    adamw,
    local_clip_grad_norm,
)
from workers.strategies.common import apply_activation_checkpointing, precision
from workers.strategies.compression import register_comm_hook


class DDPStrategy:
    name = "ddp"

    def wrap(self, model: nn.Module, ctx: StrategyContext) -> nn.Module:
        model = model.to(ctx.device)
        apply_activation_checkpointing(model, ctx)
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        ddp = DistributedDataParallel(model, device_ids=device_ids)
        register_comm_hook(ddp, ctx)  # plain, fp16/bf16-compressed or PowerSGD (parallel.compression)
        return ddp

    def build_optimizer(self, wrapped: nn.Module, ctx: StrategyContext) -> torch.optim.Optimizer:
        return adamw(wrapped.parameters(), ctx.spec)

    def forward_backward(self, wrapped: nn.Module, micro: list, loss_fn: LossFn, ctx: StrategyContext) -> ForwardBackward:
        with precision(ctx):
            return accumulate(wrapped, micro, loss_fn, ctx, wrapped.no_sync)

    def clip_grad_norm(self, wrapped: nn.Module, max_norm: float) -> float | None:
        return local_clip_grad_norm(wrapped, max_norm)
