"""SDP synchronisation on 4 real gloo processes (torch.multiprocessing, no Ray), with hand-checkable values:
every rank fills its tensors with (rank + 1), so a piece averaged among holders H must read mean(h + 1 for h in H)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from workers.models.gpt import GPT
from workers.parallel.sdp.masks import assign
from workers.parallel.sdp.subnetwork import build_subnetwork
from workers.parallel.sdp.sync import HolderSync, _select
from workers.telemetry import CommMeter, ring_allreduce_bytes

WORLD = 4


class CountingMeter(CommMeter):
    def reset(self) -> None:
        super().reset()
        self.launches = 0

    def launched(self, logical_bytes: int) -> float:
        self.launches += 1
        return super().launched(logical_bytes)


def full_model() -> GPT:
    torch.manual_seed(0)
    return GPT(vocab_size=32, seq_len=8, n_layers=4, d_model=8, n_heads=2)


def _worker(rank: int, init: str, mode: str, masking: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    try:
        torch.set_num_threads(1)
        full = full_model()
        n = 4 if mode == "block" else 32
        a = assign(mode, WORLD, 1 if mode == "block" else 4, n, 0.5, seed=1)
        sub, pieces = build_subnetwork(copy.deepcopy(full), a, rank, masking)
        params = dict(sub.named_parameters())
        meter = CountingMeter()
        sync = HolderSync(a, rank, 0, 1, pieces, params, meter)
        held = [p for p in pieces if rank in p.holders]

        # 1. Gradients: (rank + 1) everywhere, averaged among holders only.
        for q in params.values():
            if q.requires_grad:
                q.grad = torch.full_like(q, float(rank + 1))
        sync.average(grad=True)
        for p in held:
            want = sum(h + 1 for h in p.holders) / len(p.holders)
            got = _select(params[p.local].grad, p)
            assert torch.equal(got, torch.full_like(got, want)), (rank, p.global_name, p.holders, got.flatten()[:3], want)
        # Logical bytes: one ring all-reduce per holder set this rank is in, over the pieces it holds there.
        expected = 0
        for holders, bucket in sync.buckets.items():
            expected += ring_allreduce_bytes(4 * sum(_select(params[p.local], p).numel() for p in bucket), len(holders))
        assert meter.logical_bytes == expected > 0
        # Bucketed: one all-reduce per holder set (of 2+ workers), however many tensors share it.
        shared = [p for p in held if len(p.holders) > 1]
        assert meter.launches == len({p.holders for p in shared}) < len(shared)

        # 2. Parameters: same rule; backward masking then copies each piece from its lowest holder to the others.
        with torch.no_grad():
            for q in params.values():
                q.fill_(float(rank + 1))
        sync.average(grad=False)
        if masking == "backward":
            sync.refresh_unheld()
        for p in pieces:
            if rank in p.holders:
                want = sum(h + 1 for h in p.holders) / len(p.holders)
            elif masking == "backward":  # frozen copy of a piece held elsewhere
                want = sum(h + 1 for h in p.holders) / len(p.holders)
            else:
                continue
            got = _select(params[p.local].detach(), p)
            assert torch.equal(got, torch.full_like(got, want)), (rank, masking, p.global_name, p.holders, want)

        # 3. The full model, assembled from the lowest holder of every piece, is the original one exactly.
        sub2, pieces2 = build_subnetwork(copy.deepcopy(full), a, rank, masking)
        sync2 = HolderSync(a, rank, 0, 1, pieces2, dict(sub2.named_parameters()), CommMeter())
        shapes = {k: v.shape for k, v in full.named_parameters()}
        state = sync2.full_state(shapes, dict(sub2.named_parameters()))
        for k, v in full.named_parameters():
            assert torch.equal(state[k], v.detach()), (rank, k)
    finally:
        dist.destroy_process_group()


# make test: each mode once and each masking once; the other two pairs in make test-all
@pytest.mark.parametrize(("mode", "masking"), [pytest.param("block", "forward", marks=pytest.mark.exhaustive),
                                               ("neuron", "forward"),
                                               pytest.param("neuron", "backward", marks=pytest.mark.exhaustive),
                                               ("block", "backward")])
def test_averaging_touches_exactly_the_holders(tmp_path, mode, masking):
    mp.spawn(_worker, args=(f"file://{tmp_path}/rendezvous", mode, masking), nprocs=WORLD, join=True)
