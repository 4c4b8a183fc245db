"""Data parallelism with torch DDP; a communication hook meters the all-reduces.

(No `from __future__ import annotations`: DDP checks the hook's real annotations.)
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from workers.strategies.base import ForwardBackward, LossFn, StrategyContext, accumulate, adamw, local_clip_grad_norm
from workers.telemetry import CommMeter, ring_allreduce_bytes


def metered_allreduce_hook(meter: CommMeter, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The default averaging all-reduce, recording logical bytes and completion time."""
    buffer = bucket.buffer()
    world = dist.get_world_size()
    meter.launched(ring_allreduce_bytes(buffer.numel() * buffer.element_size(), world))
    buffer.div_(world)
    fut = dist.all_reduce(buffer, async_op=True).get_future()

    def done(f: torch.futures.Future) -> torch.Tensor:
        meter.finished()
        return f.value()[0]

    return fut.then(done)


class DDPStrategy:
    name = "ddp"

    def wrap(self, model: nn.Module, ctx: StrategyContext) -> nn.Module:
        model = model.to(ctx.device)
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        ddp = DistributedDataParallel(model, device_ids=device_ids)
        ddp.register_comm_hook(ctx.comm, metered_allreduce_hook)
        return ddp

    def build_optimizer(self, wrapped: nn.Module, ctx: StrategyContext) -> torch.optim.Optimizer:
        return adamw(wrapped.parameters(), ctx.spec)

    def forward_backward(self, wrapped: nn.Module, micro: list, loss_fn: LossFn, ctx: StrategyContext) -> ForwardBackward:
        return accumulate(wrapped, micro, loss_fn, ctx.device, wrapped.no_sync)

    def clip_grad_norm(self, wrapped: nn.Module, max_norm: float) -> float | None:
        return local_clip_grad_norm(wrapped, max_norm)
