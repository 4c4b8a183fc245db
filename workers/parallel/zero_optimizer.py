"""ZeRO stages 1 and 2 over the data-parallel dimension (parameters stay whole).

Every parameter is split by rows exactly as a DTensor `Shard(0)` would split it
(ceil(rows / K) rows per rank, the last ranks possibly shorter or empty). A
reduce-scatter leaves each rank the averaged gradient of its rows; each rank runs
AdamW on its rows only and an all-gather rebuilds the whole parameter. Traffic per
step is reduce-scatter + all-gather = 2(K-1)/K x gradient bytes, the same as DDP
(stage 2 with A micro-batches per rank: (A + 1)(K-1)/K x gradient bytes).

  stage 1: after the local backward over all micro-batches, one flat reduce-scatter
           over all parameters; gradients stay whole in `p.grad` (only this rank's
           rows are averaged); optimiser state is sharded -> 4 + 4 + 8/K bytes per
           fp32 param, between steps and at peak.
  stage 2: during every micro-batch's backward, bucket by bucket as gradients are
           ready (workers/parallel/zero_buckets.py); each whole gradient is freed once
           reduced and this rank accumulates its rows -> 4 + 12/K bytes per param
           between steps, plus about one bucket of whole gradients at peak; the
           gradients' reduce-scatter runs once per micro-batch (as DeepSpeed's).

The optimiser state is exposed as `Shard(0)` DTensors keyed by the model's own
parameters, so torch.distributed.checkpoint saves and reshards it exactly like
an FSDP2 optimiser's: a ZeRO checkpoint loads under DDP, FSDP or another K.

A 0-dim parameter (a learnable temperature) has no rows to split: it stays whole on
every rank, its gradient is all-reduced, and every rank updates it with plain
(replicated) AdamW state, which DCP saves as DDP's optimiser would.
"""

from __future__ import annotations

import contextlib
import math
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard
from torch.optim.adam import adam

from workers.parallel import zero_buckets
from workers.parallel.layouts.accounting import ring
from workers.parallel.replicas import local
from workers.telemetry import CommMeter


def _rows(n: int, k: int, r: int) -> tuple[int, int, int]:
    """(rows per shard, first row, end row) of rank r's Shard(0) slice of n rows."""
    per = math.ceil(n / k) if n else 0
    lo = min(r * per, n)
    return per, lo, min(lo + per, n)


def _padded(t: torch.Tensor, rows: int) -> torch.Tensor:
    if t.shape[0] == rows:
        return t
    return torch.cat([t, t.new_zeros((rows - t.shape[0], *t.shape[1:]))])


class ShardedAdamW(torch.optim.Optimizer):
    """AdamW whose state (and, at stage 2, gradient) covers only this rank's rows of each parameter."""

    def __init__(self, params, *, lr: float, weight_decay: float, stage: int, mesh: DeviceMesh,
                 comm: CommMeter, offload: bool = False, bucket_bytes: int | None = None):
        # AdamW's own defaults (amsgrad, foreach, ...) so that checkpoints carry the same param_groups keys.
        defaults = torch.optim.AdamW([torch.zeros(1, requires_grad=True)], lr=lr, weight_decay=weight_decay,
                                     foreach=None).defaults
        super().__init__(params, defaults)
        self.stage, self.mesh, self.comm, self.offload = stage, mesh, comm, offload
        self.group = mesh.get_group()
        self.k, self.r = self.group.size(), dist.get_rank(self.group)
        self.grad_shards: dict[torch.Tensor, torch.Tensor] = {}
        # Stage 2 reduce-scatters during backward; stage 1 keeps whole gradients anyway, so reduces after it.
        size = bucket_bytes or zero_buckets.BUCKET_BYTES
        self.buckets = (zero_buckets.GradientBuckets(list(self._params()), size, self._reduce_scatter)
                        if stage == 2 else None)
        self.on_grad_shards: Callable[[list[torch.Tensor]], None] | None = None  # memory accounting (telemetry)

    def _params(self):
        """The parameters split by rows (all but 0-dim ones)."""
        for group in self.param_groups:
            yield from (p for p in group["params"] if p.dim() > 0)

    def _scalars(self):
        """0-dim parameters: kept whole and replicated (see the module docstring)."""
        for group in self.param_groups:
            yield from (p for p in group["params"] if p.dim() == 0)

    def sharded_grads(self) -> list[torch.Tensor]:
        """Gradient storage held outside `p.grad` (stage 2), for memory accounting."""
        return list(self.grad_shards.values())

    # --- gradients ---------------------------------------------------------

    def micro_batch(self) -> contextlib.AbstractContextManager:
        """Around every micro-batch but the last (the last one's buckets `reduce_scatter_grads` flushes)."""
        return self.buckets.micro_batch() if self.buckets is not None else contextlib.nullcontext()

    @torch.no_grad()
    def reduce_scatter_grads(self) -> None:
        """After backward: average the gradients over the data-parallel group, keeping this rank's rows
        (stage 2: the buckets not reduced during backward)."""
        self._all_reduce_scalar_grads()
        if self.buckets is not None:
            self.buckets.finish()
        else:
            self._reduce_scatter(list(self._params()))

    @torch.no_grad()
    def _reduce_scatter(self, params: list[torch.Tensor]) -> None:
        """One reduce-scatter for `params`: rank r's segment of the flat input holds rows
        [r x per, (r+1) x per) of every gradient (zero-padded), so the output is this rank's rows."""
        grads = [(p, p.grad) for p in params if p.grad is not None]
        if not grads:
            return
        layout = [(p, g, *_rows(p.shape[0], self.k, self.r)) for p, g in grads]
        flat = torch.cat([_padded(g.div_(self.k), per * self.k).reshape(self.k, -1) for _, g, per, _, _ in layout],
                         dim=1)
        out = flat.new_empty(flat.shape[1])
        self.comm.launched(int((self.k - 1) / self.k * flat.numel() * flat.element_size()))
        dist.reduce_scatter_tensor(out, flat.view(-1), group=self.group)  # rank-major segments
        self.comm.finished()
        del flat
        offset = 0
        for p, g, per, lo, hi in layout:
            size = per * (p.numel() // p.shape[0])
            mine = out[offset: offset + size].view(per, *p.shape[1:])[: hi - lo]
            offset += size
            if self.stage == 1:
                g[lo:hi].copy_(mine)
            else:
                if p in self.grad_shards:  # a later micro-batch: accumulate into the rows
                    self.grad_shards[p].add_(mine)
                else:
                    self.grad_shards[p] = mine  # a view of this bucket's output: its storage is the shards
                p.grad = None  # stage 2: the whole gradient is not kept
        if self.stage == 2 and self.on_grad_shards is not None:
            self.on_grad_shards(list(self.grad_shards.values()))

    def _all_reduce_scalar_grads(self) -> None:
        """Average the 0-dim parameters' gradients in one small all-reduce (kept whole at stage 2 too)."""
        scalars = [p for p in self._scalars() if p.grad is not None]
        if not scalars:
            return
        flat = torch.stack([p.grad.div(self.k) for p in scalars])  # divide first, as the reduce-scatter does
        self.comm.launched(int(ring(self.k) * flat.numel() * flat.element_size()))
        dist.all_reduce(flat, group=self.group)
        self.comm.finished()
        for p, g in zip(scalars, flat):
            p.grad.copy_(g)

    def _grad_rows(self, p: nn.Parameter) -> torch.Tensor | None:
        if p in self.grad_shards:
            return self.grad_shards[p]
        if p.grad is None or p.dim() == 0:
            return p.grad
        _, lo, hi = _rows(p.shape[0], self.k, self.r)
        return p.grad[lo:hi]

    @torch.no_grad()
    def clip_grad_norm(self, max_norm: float) -> float | None:
        shards = [g for g in (self._grad_rows(p) for p in self._params()) if g is not None]
        whole = [p.grad for p in self._scalars() if p.grad is not None]  # identical on every rank
        if not shards and not whole:
            return None
        device = (shards or whole)[0].device  # NCCL reduces device tensors only, even with no shard here
        total = sum((g.double().pow(2).sum() for g in shards), torch.zeros((), dtype=torch.float64, device=device))
        dist.all_reduce(total, group=self.group)
        total += sum((g.double().pow(2) for g in whole), torch.zeros((), dtype=torch.float64, device=device))  # once
        norm = math.sqrt(float(total))
        coef = max_norm / (norm + 1e-6)
        if coef < 1.0:
            for g in shards + whole:
                g.mul_(coef)
        return norm

    # --- the update ----------------------------------------------------------

    def _state_of(self, p: nn.Parameter, like: torch.Tensor) -> dict:
        state = self.state[p]
        if not state:
            def sharded_zeros() -> torch.Tensor:
                local = torch.zeros_like(like, device="cpu" if self.offload else like.device)
                if p.dim() == 0:  # whole on every rank: a plain tensor, as AdamW's own
                    return local
                return DTensor.from_local(local, self.mesh, [Shard(0)], run_check=False,
                                          shape=p.shape, stride=p.stride())
            state.update(step=torch.tensor(0.0), exp_avg=sharded_zeros(), exp_avg_sq=sharded_zeros())
        return state

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                grad = self._grad_rows(p)
                if grad is None:
                    continue
                state = self._state_of(p, grad)
                rows = p.data[slice(*_rows(p.shape[0], self.k, self.r)[1:])] if p.dim() else p.data
                work = rows.to(state["exp_avg"].device) if self.offload else rows
                # The same single-tensor AdamW arithmetic as torch.optim.AdamW(foreach=False).
                adam([work], [grad.to(work.device)], [local(state["exp_avg"])],
                     [local(state["exp_avg_sq"])], [], [state["step"]], foreach=False,
                     decoupled_weight_decay=True, amsgrad=False, beta1=beta1, beta2=beta2,
                     lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)
                if work is not rows:
                    rows.copy_(work)
        self._all_gather_params()

    @torch.no_grad()
    def _all_gather_params(self) -> None:
        """One all-gather of every parameter's rows (the inverse of the reduce-scatter's layout)."""
        layout = [(p, *_rows(p.shape[0], self.k, self.r)) for p in self._params()]
        if not layout:
            return
        mine = torch.cat([_padded(p.data[lo:hi], per).reshape(-1) for p, per, lo, hi in layout])
        full = mine.new_empty(self.k * mine.numel())
        self.comm.launched(int((self.k - 1) / self.k * full.numel() * full.element_size()))
        dist.all_gather_into_tensor(full, mine, group=self.group)
        full = full.view(self.k, -1)
        self.comm.finished()
        offset = 0
        for p, per, _, _ in layout:
            size = per * (p.numel() // p.shape[0])
            p.data.copy_(full[:, offset: offset + size].reshape(per * self.k, *p.shape[1:])[: p.shape[0]])
            offset += size

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        self.grad_shards.clear()
