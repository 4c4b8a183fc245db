"""ZeRO-2 reduce-scatters gradient buckets during backward (workers/parallel/zero_buckets.py), on real gloo
ranks (no Ray): with two micro-batches per rank its measured gradient high-water mark is about 1/K of the
whole gradients plus one bucket, where DDP holds them whole, and its losses stay DDP's."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tests.workers.gloo_ranks import spawn_ranks

BUCKET_BYTES = 128 * 1024
# 8 blocks of d_model 64: ~1.7 MB of fp32 gradients, a dozen buckets; 2 micro-batches per rank.
MODEL = {"resources.workers": 2, "model.n_layers": 8, "model.d_model": 64, "model.n_heads": 4,
         "train.global_batch_size": 8, "train.micro_batch_size": 2, "train.steps": 2}


def _train(rank, world, port, queue, tmp):
    from pathlib import Path

    from tests.helpers import spec_of
    from workers.parallel import zero_buckets
    from workers.training.trainer import Trainer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    zero_buckets.BUCKET_BYTES = BUCKET_BYTES  # small buckets, so that a small model has many
    out = {}
    for zero in (0, 2):
        trainer = Trainer(spec_of(**MODEL, **{"parallel.zero": zero}), rank, world, torch.device("cpu"),
                          Path(tmp) / f"zero{zero}")
        losses, grad_peaks = [], []
        for _ in range(2):
            losses.append(trainer.train_step().loss)
            grad_peaks.append(trainer.memory.last.category_peaks["grads"])
        grad_bytes = sum(p.numel() * p.element_size() for p in trainer.model.parameters())
        largest = max(p.numel() * p.element_size() for p in trainer.model.parameters())
        out[zero] = (losses, max(grad_peaks), grad_bytes, largest, trainer.comm.logical_bytes)
    queue.put((rank, out))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return spawn_ranks(_train, 2, str(tmp_path_factory.mktemp("zero2-buckets")))


def test_zero2_holds_a_shard_and_one_bucket_of_gradients_at_peak(trained):
    for rank, out in trained:
        _, ddp_peak, grad_bytes, largest, _ = out[0]
        _, zero2_peak, _, _, _ = out[2]
        assert ddp_peak >= grad_bytes, (rank, ddp_peak, grad_bytes)  # whole gradients, accumulated
        bound = grad_bytes / 2 + BUCKET_BYTES + largest  # a bucket overflows its size by < one parameter
        assert zero2_peak <= bound, (rank, zero2_peak, bound, grad_bytes)
        assert zero2_peak < 0.75 * grad_bytes, (rank, zero2_peak / grad_bytes)


def test_zero2_keeps_ddp_losses_and_reduces_once_per_micro_batch(trained):
    for rank, out in trained:
        ddp_losses, zero2_losses = out[0][0], out[2][0]
        assert zero2_losses == pytest.approx(ddp_losses, rel=1e-5), rank
        ddp_bytes, zero2_bytes = out[0][4], out[2][4]
        assert zero2_bytes == pytest.approx(1.5 * ddp_bytes, rel=0.01)  # 2 reduce-scatters + 1 all-gather
