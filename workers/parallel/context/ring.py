"""One hop around the context-parallel ring: send to the next cp rank, receive from the previous one."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist


class _Sent:
    """Bytes this process sent around cp rings since the last `take_ring_bytes` (the step's communication
    telemetry: these point-to-point sends are issued inside autograd, where no strategy's meter sees them)."""
    bytes = 0


def take_ring_bytes() -> int:
    sent, _Sent.bytes = _Sent.bytes, 0
    return sent


def ring_shift(tensor: torch.Tensor, group: dist.ProcessGroup | None, tag: int = 0) -> Callable[[], torch.Tensor]:
    """Start passing `tensor` to cp rank r+1 while receiving rank r-1's into a new buffer; returns a `wait()`
    that gives the received tensor. Asynchronous so the caller computes on what it holds meanwhile; `tensor`
    must stay unchanged until wait(). Distinct `tag`s keep two shifts in flight to the same peer apart."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    tensor = tensor.contiguous()
    received = torch.empty_like(tensor)
    _Sent.bytes += tensor.numel() * tensor.element_size()
    works = dist.batch_isend_irecv([
        dist.P2POp(dist.isend, tensor, group=group, tag=tag, group_peer=(rank + 1) % size),
        dist.P2POp(dist.irecv, received, group=group, tag=tag, group_peer=(rank - 1) % size),
    ])

    def wait() -> torch.Tensor:
        for work in works:
            work.wait()
        return received

    return wait
