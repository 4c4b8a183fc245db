"""The planner's predicted peak per rank (workers/parallel/planner.py) against the peak measured inside the
steps (workers/step_memory.py), per layout, on real gloo processes (no Ray), 3 steps each (every one
measured; the largest counts: the first update creates the optimiser state). Every layout runs several
micro-batches per rank, where gradients kept between micro-batches show. Usage:
  PYTHONPATH=. python bench/planner_vs_peak.py            # every layout of LAYOUTS
  PYTHONPATH=. python bench/planner_vs_peak.py ddp fsdp   # some of them
tests/workers/test_planner_peak.py asserts every ratio is within 0.85-1.15."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from tests.workers.gloo_ranks import spawn_ranks

STEPS = 3
# 16 samples per step in micro-batches of 2: 4 micro-batches per rank at dp 2, 2 at dp 4.
BASE = {"model.n_layers": 2, "model.n_heads": 4, "model.d_model": 32, "train.global_batch_size": 16,
        "train.micro_batch_size": 2, "checkpoint.every_steps": 0}
Z3 = {"parallel.zero": 3}
# name -> (ranks, spec overrides)
LAYOUTS: dict[str, tuple[int, dict]] = {
    "ddp": (2, {}),
    "ddp_ac": (2, {"parallel.activation_checkpointing": True}),
    "ddp_bf16": (2, {"parallel.mixed_precision": "bf16"}),
    "ddp_amp16": (2, {"parallel.mixed_precision": "fp16"}),
    "local_sgd": (2, {"parallel.local_sgd": {"period": 2}}),
    "zero1": (2, {"parallel.zero": 1}),
    "zero2": (2, {"parallel.zero": 2}),
    "zero2_offload": (2, {"parallel.zero": 2, "parallel.offload_optimizer": True}),
    "fsdp": (2, Z3),
    "fsdp_unsharded_acc": (2, {**Z3, "parallel.fsdp_accumulate": "unsharded"}),
    "fsdp_keep": (2, {**Z3, "parallel.reshard_after_forward": False}),
    "fsdp_ac": (2, {**Z3, "parallel.activation_checkpointing": True}),
    "fsdp_bf16": (2, {**Z3, "parallel.mixed_precision": "bf16"}),
    "tp2": (2, {"parallel.tp": 2}),
    "tp2_sp": (2, {"parallel.tp": 2, "parallel.sequence_parallel": True}),
    "pp2_gpipe": (2, {"parallel.pp": 2, "parallel.pipeline": {"schedule": "gpipe"}}),
    "pp2_1f1b": (2, {"parallel.pp": 2, "parallel.pipeline": {"schedule": "1f1b"}}),
    "pp2_interleaved": (2, {"parallel.pp": 2, "model.n_layers": 4,
                            "parallel.pipeline": {"schedule": "interleaved_1f1b"}}),
    "ddp4": (4, {}),
    "zero2_4": (4, {"parallel.zero": 2}),
    "fsdp4": (4, Z3),
    "hsdp": (4, {**Z3, "parallel.dp_shard": 2}),
    "dp2xtp2": (4, {"parallel.tp": 2}),
    "fsdp2xtp2": (4, {**Z3, "parallel.tp": 2}),
    "tp4_sp": (4, {"parallel.tp": 4, "parallel.sequence_parallel": True}),
    "pp2xdp2": (4, {"parallel.pp": 2, "parallel.pipeline": {"schedule": "1f1b"}}),
    "pp2xcp2": (4, {"parallel.pp": 2, "parallel.cp": 2, "parallel.pipeline": {"schedule": "1f1b"}}),
}


def _measure(rank, world, port, queue, tmp, names):
    from tests.helpers import spec_of
    from workers.parallel.planner import estimate
    from workers.training.trainer import Trainer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    out = {}
    for name in names:
        spec = spec_of(**{**BASE, "resources.workers": world, **LAYOUTS[name][1]})
        trainer = Trainer(spec, rank, world, torch.device("cpu"), Path(tmp) / name)
        peak = max(trainer.train_step().peak_memory_bytes or 0 for _ in range(STEPS))
        predicted = estimate(spec)
        out[name] = (peak, predicted.memory_bytes_per_rank, predicted.peak_state_bytes_per_rank,
                     predicted.activation_bytes_per_rank)
        del trainer  # its buffers must not count in the next layout's steps
    queue.put((rank, out))
    dist.destroy_process_group()


def measure(names: list[str]) -> dict[str, tuple[int, int, int, int]]:
    """name -> (measured peak, predicted peak, predicted state at peak, predicted activations), of the rank
    with the highest measured peak."""
    results: dict[str, tuple[int, int, int, int]] = {}
    for world in sorted({LAYOUTS[n][0] for n in names}):
        group = [n for n in names if LAYOUTS[n][0] == world]
        for _, out in spawn_ranks(_measure, world, tempfile.mkdtemp(), group):
            for name, row in out.items():
                if name not in results or row[0] > results[name][0]:
                    results[name] = row
    return results


def table(results: dict[str, tuple[int, int, int, int]]) -> str:
    lines = [f"{'layout':20} {'ranks':>5} {'measured peak':>14} {'predicted':>10} {'ratio':>6} "
             f"{'state@peak':>11} {'activations':>12}"]
    for name, (peak, predicted, state, act) in results.items():
        lines.append(f"{name:20} {LAYOUTS[name][0]:>5} {peak:>14} {predicted:>10} {predicted / peak:>6.2f} "
                     f"{state:>11} {act:>12}")
    return "\n".join(lines)


def main() -> None:
    names = sys.argv[1:] or list(LAYOUTS)
    print(table(measure(names)))


if __name__ == "__main__":
    main()
