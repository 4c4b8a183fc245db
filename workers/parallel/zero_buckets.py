"""ZeRO-2's gradient buckets: reduce-scatter each bucket during backward, as soon as its gradients are ready.

The parameters are grouped, in reverse registration order (roughly the order backward produces their
gradients), into buckets of about `bucket_bytes`. A post-accumulate-grad hook marks a parameter ready;
when every parameter of the next bucket is ready, the bucket is reduce-scattered and its whole gradients
are freed. Buckets are launched strictly in index order, so every rank issues the same collectives in the
same order whatever the order its hooks fire in; buckets that never complete (a parameter without a
gradient) are flushed by `finish()` after each micro-batch's backward. This happens in every micro-batch,
as DeepSpeed's stage 2 does: whole gradients are never accumulated across micro-batches, so at the peak a
rank holds its 1/K shards plus about one bucket of whole gradients, at the price of one reduce-scatter of
the gradients per micro-batch instead of per step.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch

BUCKET_BYTES = 4 * 1024 * 1024  # whole-gradient bytes per bucket (one reduce-scatter each)


def _buckets(params: list[torch.Tensor], bucket_bytes: int) -> list[list[torch.Tensor]]:
    out: list[list[torch.Tensor]] = [[]]
    size = 0
    for p in reversed(params):
        if out[-1] and size + p.numel() * p.element_size() > bucket_bytes:
            out.append([])
            size = 0
        out[-1].append(p)
        size += p.numel() * p.element_size()
    return [b for b in out if b]


class GradientBuckets:
    """Hooks on `params` that call `reduce_scatter(bucket)` bucket by bucket during the last backward."""

    def __init__(self, params: list[torch.Tensor], bucket_bytes: int,
                 reduce_scatter: Callable[[list[torch.Tensor]], None]) -> None:
        self.buckets = _buckets([p for p in params if p.requires_grad], bucket_bytes)
        self._bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        self._reduce_scatter = reduce_scatter
        self._ready: list[int] = [0] * len(self.buckets)
        self._next = 0  # the next bucket to launch
        for bucket in self.buckets:
            for p in bucket:
                p.register_post_accumulate_grad_hook(self._accumulated)

    @contextlib.contextmanager
    def micro_batch(self) -> Iterator[None]:
        """Around one micro-batch's forward and backward: then the buckets its hooks did not launch."""
        yield
        self.finish()

    def _accumulated(self, p: torch.Tensor) -> None:
        self._ready[self._bucket_of[id(p)]] += 1
        while self._next < len(self.buckets) and self._ready[self._next] == len(self.buckets[self._next]):
            self._launch(self._next)

    def _launch(self, i: int) -> None:
        self._next = i + 1
        with torch.no_grad():
            self._reduce_scatter([p for p in self.buckets[i] if p.grad is not None])

    def finish(self) -> None:
        """After a backward: the buckets not launched yet (some parameter got no gradient), in order."""
        while self._next < len(self.buckets):
            self._launch(self._next)
        self._ready = [0] * len(self.buckets)
        self._next = 0
