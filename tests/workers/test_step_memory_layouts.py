"""Peak-memory tracking under every kind of layout, on real gloo ranks (no Ray): the CPU dispatch mode
must not change what a step computes (losses bit-identical with and without it) and must report a peak
above the between-steps state. Two ranks per layout, three steps; `exhaustive` (make test-all)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tests.workers.gloo_ranks import spawn_ranks

pytestmark = pytest.mark.exhaustive

BASE = {"resources.workers": 2, "model.n_layers": 2, "model.n_heads": 4, "model.d_model": 32,
        "train.global_batch_size": 8, "train.micro_batch_size": 2}
LAYOUTS = {
    "fsdp": {"parallel.zero": 3},
    "fsdp_keep_ac": {"parallel.zero": 3, "parallel.reshard_after_forward": False,
                     "parallel.activation_checkpointing": True},
    "tp2_sp": {"parallel.tp": 2, "parallel.sequence_parallel": True},
    "pp2": {"parallel.pp": 2},
    "zero2_offload": {"parallel.zero": 2, "parallel.offload_optimizer": True},
    "powersgd": {"parallel.compression": {"kind": "powersgd", "rank": 2}},
    "local_sgd": {"parallel.local_sgd": {"period": 2}},
    "amp16": {"parallel.mixed_precision": "fp16"},
    "sdp": {"parallel.sdp": {"mode": "block", "coverage": 0.75}},
}


def _both_ways(rank, world, port, queue, name, tmp):
    from pathlib import Path

    from tests.helpers import spec_of
    from workers.training.trainer import Trainer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    runs = {}
    for tracked in (True, False):
        trainer = Trainer(spec_of(**BASE, **LAYOUTS[name]), rank, world, torch.device("cpu"),
                          Path(tmp) / f"{name}-{tracked}")
        if not tracked:
            trainer.memory.first = trainer.memory.every = 0
        runs[tracked] = [trainer.train_step().to_dict() for _ in range(3)]
    queue.put((rank, runs))
    dist.destroy_process_group()


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_tracking_changes_nothing_and_reports_a_step_peak(tmp_path, name):
    for rank, runs in spawn_ranks(_both_ways, 2, name, str(tmp_path)):
        tracked, plain = runs[True], runs[False]
        assert [s["loss"] for s in tracked] == [s["loss"] for s in plain], (name, rank)
        assert all(s["peak_memory_bytes"] is None for s in plain)
        for s in tracked:
            assert s["peak_memory_bytes"] > s["model_state_bytes"], (name, rank, s["step"])
