"""Data parallelism with torch DDP; a communication hook meters the all-reduces.

(No `from __future__ import annotations`: DDP checks the hook's real annotations.)
"""


from typing import ContextManager

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from workers.strategies.base import StrategyContext
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

    def no_sync(self, wrapped: nn.Module) -> ContextManager:
        return wrapped.no_sync()

    def unwrap(self, wrapped: nn.Module) -> nn.Module:
        return wrapped.module
