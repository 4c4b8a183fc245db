"""Peak memory measured inside the training step, on real gloo ranks (no Ray): the figure is a peak during
the step (it holds a micro-batch's logits, which no between-steps figure does), its breakdown matches the
model's own state, the CPU schedule measures steps 1-3 and every MEASURE_EVERY-th (shortened to 5 here),
and activation checkpointing of an 8-block model lowers the activations' high-water mark to at most 0.6x."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from tests.workers.gloo_ranks import spawn_ranks

PERIOD = 5
MEASURED = [1, 2, 3, 5, 10]  # MEASURED_FIRST_STEPS, then every PERIOD-th
DDP = {"resources.workers": 2, "train.steps": 10, "train.global_batch_size": 8, "train.micro_batch_size": 2}
# 8 blocks wide enough that their saved activations, not the logits, dominate the activations' peak.
EIGHT_BLOCKS = {"resources.workers": 2, "model.n_layers": 8, "model.d_model": 64, "model.n_heads": 4,
                "model.seq_len": 64, "train.global_batch_size": 8, "train.micro_batch_size": 4}


def _records(rank: int, world: int, overrides: dict, steps: int, job_dir) -> tuple[list[dict], int]:
    from tests.helpers import spec_of
    from workers.training.trainer import Trainer

    trainer = Trainer(spec_of(**overrides), rank, world, torch.device("cpu"), job_dir)
    records = [trainer.train_step().to_dict() for _ in range(steps)]
    return records, sum(p.numel() * p.element_size() for p in trainer.model.parameters())


def _measure(rank, world, port, queue, tmp):
    from pathlib import Path

    from workers import step_memory

    step_memory.MEASURE_EVERY = PERIOD  # 10 steps then cover two periods
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    ddp, param_bytes = _records(rank, world, DDP, 10, Path(tmp) / "ddp")
    act = {ac: _records(rank, world, {**EIGHT_BLOCKS, "parallel.activation_checkpointing": ac}, 2,
                        Path(tmp) / f"ac-{ac}")[0] for ac in (False, True)}
    queue.put((rank, ddp, param_bytes, act))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    return spawn_ranks(_measure, 2, str(tmp_path_factory.mktemp("step-memory")))


def test_the_peak_is_taken_during_the_step_and_broken_down(measured):
    for rank, steps, param_bytes, _ in measured:
        assert [s["step"] for s in steps if s["peak_memory_bytes"] is not None] == MEASURED, rank
        assert [s["step"] for s in steps if s["memory_tracked"]] == MEASURED, rank  # their times carry its cost
        logits = 2 * 32 * 256 * 4  # one micro-batch's fp32 logits: live during the step, never between steps
        for s in steps:
            if s["peak_memory_bytes"] is None:
                assert s["peak_memory_breakdown"] is None and s["peak_activation_bytes"] is None
                continue
            parts = s["peak_memory_breakdown"]
            assert s["peak_memory_bytes"] == sum(parts.values())
            assert s["peak_memory_bytes"] >= s["model_state_bytes"] + logits, (rank, s)
            assert s["peak_activation_bytes"] >= logits
            assert parts["params"] == param_bytes
            # From step 2 AdamW's two fp32 moments exist before the step: in every peak.
            assert parts["optimizer"] == (2 * param_bytes if s["step"] > 1 else parts["optimizer"]), (rank, s)


def test_activation_checkpointing_lowers_the_activation_peak(measured):
    for rank, _, _, act in measured:
        without, with_ac = act[False][-1], act[True][-1]
        ratio = with_ac["peak_activation_bytes"] / without["peak_activation_bytes"]
        assert ratio <= 0.6, (rank, ratio, without["peak_activation_bytes"], with_ac["peak_activation_bytes"])
        assert with_ac["peak_memory_bytes"] < without["peak_memory_bytes"]
        assert with_ac["loss"] == pytest.approx(without["loss"], rel=1e-5)  # recompute changes memory only
