"""Averaging every shared piece among exactly the workers that hold it.

One process group per distinct holder set (and, under FSDP, per shard index:
the ranks h x S + s of the holder workers h), created in the same order on
every rank. All pieces with the same holder set are flattened into one bucket
and reduced with one all-reduce, so the number of collectives per sync is the
number of holder sets this worker belongs to, not the number of tensors.
Buckets list their pieces by (full-model name, first index): the same order on
every holder. Logical bytes go to the CommMeter by the ring formula over |H|.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from workers.parallel.replicas import ReplicaGroup
from workers.parallel.sdp.masks import Assignment
from workers.parallel.sdp.subnetwork import Piece
from workers.telemetry import CommMeter, ring_allreduce_bytes


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor (the local shard of an FSDP DTensor)."""
    return t._local_tensor if hasattr(t, "_local_tensor") else t


def _select(t: torch.Tensor, piece: Piece) -> torch.Tensor:
    if piece.dim is None:
        return t
    return t.index_select(piece.dim, torch.tensor(piece.local_index, device=t.device))


def _write(t: torch.Tensor, piece: Piece, values: torch.Tensor) -> None:
    if piece.dim is None:
        t.copy_(values.view_as(t))
    else:
        assert piece.local_index is not None  # set whenever dim is
        shape = list(t.shape)
        shape[piece.dim] = len(piece.local_index)
        t.index_copy_(piece.dim, torch.tensor(piece.local_index, device=t.device), values.view(shape))


def all_holder_sets(a: Assignment) -> list[tuple[int, ...]]:
    """Every distinct holder set of the assignment, sorted: identical on all ranks."""
    sets = {tuple(range(a.workers))}
    for layer in range(a.layers):
        sets.update(a.holders(layer, c) for c in range(a.n))
    return sorted(sets, key=lambda h: (len(h), h))


class HolderSync:
    def __init__(self, a: Assignment, worker: int, shard: int, shards: int, pieces: list[Piece],
                 params: dict[str, nn.Parameter], comm: CommMeter):
        self.worker, self.shard, self.shards, self.comm = worker, shard, shards, comm
        self.pieces, self.params = pieces, params
        self.device = next(iter(params.values())).device if params else torch.device("cpu")
        self.sets = all_holder_sets(a)
        world = a.workers * shards
        self.groups: dict[tuple[int, ...], object] = {}
        for holders in self.sets:  # every rank creates every group, in the same order
            for s in range(shards):
                ranks = [h * shards + s for h in holders]
                if len(ranks) == world:
                    group = dist.group.WORLD
                elif len(ranks) > 1:
                    group = dist.new_group(ranks=ranks)
                else:
                    continue
                if s == shard:
                    self.groups[holders] = group
        def order(p: Piece) -> tuple[str, tuple[int, ...]]:
            return (p.global_name, p.global_index or ())

        self.buckets = {h: sorted((p for p in pieces if p.holders == h and worker in h), key=order)
                        for h in self.sets}
        self.buckets = {h: ps for h, ps in self.buckets.items() if ps and len(h) > 1}
        # Backward masking: every piece of the full model, held or frozen here, by holder set.
        self.everything = {h: sorted((p for p in pieces if p.holders == h), key=order) for h in self.sets}

    def _tensor(self, piece: Piece, grad: bool) -> torch.Tensor | None:
        p = self.params[piece.local]
        t = p.grad if grad else p.data
        return None if t is None else local(t)

    @torch.no_grad()
    def average(self, grad: bool) -> None:
        """Average gradients (grad=True) or parameters among each bucket's holders."""
        for holders, pieces in self.buckets.items():
            tensors = [self._tensor(p, grad) for p in pieces]
            if any(t is None for t in tensors):
                raise RuntimeError(f"SDP: a held piece has no gradient ({pieces[0].global_name})")
            flat = _pack(tensors, pieces)
            flat.div_(len(holders))  # divide first, as DDP does: identical numerics at C = 1
            self.comm.launched(ring_allreduce_bytes(flat.numel() * flat.element_size(), len(holders)))
            dist.all_reduce(flat, group=self.groups[holders])
            self.comm.finished()
            _unpack(flat, tensors, pieces)

    def replica_groups(self) -> list[ReplicaGroup]:
        """Each holder set's pieces, held identically by its holders (same shard index under FSDP).
        Frozen copies (backward masking) are left out: they are not this worker's to keep right."""
        return [ReplicaGroup(tuple(h * self.shards + self.shard for h in holders),
                             tuple(_select(local(self.params[p.local].data), p) for p in pieces))
                for holders, pieces in self.buckets.items()]

    @torch.no_grad()
    def refresh_unheld(self) -> None:
        """Backward masking: the lowest holder broadcasts each holder set's pieces to the workers without them."""
        for holders, pieces in self.everything.items():
            if len(holders) == len(self.sets[-1]) or not pieces:
                continue  # held by every worker: already identical
            tensors = [self._tensor(p, grad=False) for p in pieces]
            flat = _pack(tensors, pieces)
            self.comm.launched(flat.numel() * flat.element_size())
            dist.broadcast(flat, src=holders[0] * self.shards + self.shard)
            self.comm.finished()
            _unpack(flat, tensors, pieces)

    @torch.no_grad()
    def grad_norm_clip(self, max_norm: float) -> float | None:
        """Clip by the norm of the logical full gradient: each held element counted once over its holders."""
        total = torch.zeros((), dtype=torch.float64, device=self.device)  # on the device: no host sync per piece
        grads = []
        for p in self.pieces:
            if self.worker not in p.holders:
                continue
            g = self._tensor(p, grad=True)
            if g is None:
                continue
            total += _select(g, p).double().pow(2).sum() / len(p.holders)
            grads.append(g)
        dist.all_reduce(total)
        norm = math.sqrt(float(total))
        if math.isfinite(max_norm) and math.isfinite(norm):
            coef = max_norm / (norm + 1e-6)
            if coef < 1.0:
                for g in {id(g): g for g in grads}.values():
                    g.mul_(coef)
        return norm

    @torch.no_grad()
    def full_state(self, shapes: dict[str, torch.Size], gathered: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The whole model on every rank: each piece taken from its lowest holder (exact, no averaging).

        `gathered` maps local names to whole local tensors (FSDP shards already gathered).
        """
        # Model state is data: gathered on the device (a data group), returned on the host.
        full = {n: torch.zeros(s, device=self.device) for n, s in shapes.items()}
        for p in self.pieces:
            if p.holders[0] != self.worker or self.shard != 0:
                continue
            t = _select(gathered[p.local].detach().float(), p)
            if p.dim is None:
                full[p.global_name].copy_(t)
            else:
                full[p.global_name].index_copy_(p.dim, torch.tensor(p.global_index, device=self.device), t)
        flat = torch.cat([t.reshape(-1) for t in full.values()])
        dist.all_reduce(flat)  # one contributor per element, zeros elsewhere: a sum is a copy
        offset = 0
        for t in full.values():
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()
        return {n: t.cpu() for n, t in full.items()}


def _pack(tensors: list, pieces: list) -> torch.Tensor:
    """One flat buffer of the pieces' slices: one collective per holder set, not one per tensor."""
    return torch.cat([_select(t, p).reshape(-1) for t, p in zip(tensors, pieces)])


def _unpack(flat: torch.Tensor, tensors: list, pieces: list) -> None:
    offset = 0
    for t, p in zip(tensors, pieces):
        n = _select(t, p).numel()
        _write(t, p, flat[offset:offset + n])
        offset += n
