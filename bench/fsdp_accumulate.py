"""FSDP with gradient accumulation, `parallel.fsdp_accumulate: sharded` against `unsharded`, on real gloo
ranks (no Ray): peak memory and peak gradient bytes per rank (measured in steps 1-3, workers/step_memory.py),
the planner's predicted peak, gradient traffic per step and the median step time of the unmeasured steps
(the two modes' steps alternate, so a busy host slows both alike). Usage:
  PYTHONPATH=. python bench/fsdp_accumulate.py [STEPS]"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from tests.workers.gloo_ranks import spawn_ranks

RANKS = 2
# 32 samples per step in micro-batches of 4: 4 micro-batches per rank.
SPEC = {"resources.workers": RANKS, "parallel.zero": 3, "model.n_layers": 4, "model.n_heads": 4,
        "model.d_model": 64, "train.global_batch_size": 32, "train.micro_batch_size": 4,
        "checkpoint.every_steps": 0}
MODES = ("sharded", "unsharded")


def _measure(rank, world, port, queue, tmp, steps):
    from tests.helpers import spec_of
    from workers.parallel.planner import estimate
    from workers.training.trainer import Trainer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    specs = {mode: spec_of(**SPEC, **{"parallel.fsdp_accumulate": mode}) for mode in MODES}
    trainers = {mode: Trainer(spec, rank, world, torch.device("cpu"), Path(tmp) / mode) for mode, spec in specs.items()}
    records: dict[str, list] = {mode: [] for mode in MODES}
    for _ in range(steps):  # the modes' steps alternate, so a busy host slows both alike
        for mode in MODES:
            records[mode].append(trainers[mode].train_step())
    out = {}
    for mode, trainer in trainers.items():
        rs = records[mode]
        out[mode] = {
            "peak": max(r.peak_memory_bytes for r in rs if r.peak_memory_bytes is not None),
            "grads": trainer.memory.last.category_peaks["grads"] if trainer.memory.last else 0,  # of step 3
            "predicted": estimate(specs[mode]).memory_bytes_per_rank,
            "params": sum(p.numel() for p in trainer.model.parameters()),  # DTensors: the whole model's
            "comm": rs[-1].comm_bytes,
            "step_s": statistics.median([r.step_time_s for r in rs if r.peak_memory_bytes is None] or [0.0]),
            "losses": [r.loss for r in rs],
            "micro_batches": specs[mode].grad_accum_steps,
        }
    queue.put((rank, out))
    dist.destroy_process_group()


def measure(steps: int = 8) -> dict[str, dict]:
    """mode -> figures of rank 0 (steps > 3: the step time is taken over the unmeasured steps)."""
    return spawn_ranks(_measure, RANKS, tempfile.mkdtemp(), steps)[0][1]


def table(res: dict[str, dict]) -> str:
    s, u = res["sharded"], res["unsharded"]
    rows = [("peak bytes/rank", "peak"), ("planner's peak", "predicted"), ("peak gradient bytes", "grads"),
            ("gradient comm bytes/step", "comm"), ("step s (median)", "step_s")]
    lines = [f"FSDP on {RANKS} gloo ranks, {s['micro_batches']} micro-batches per rank, "
             f"{s['params']} parameters ({4 * s['params']} B of fp32 gradients, {4 * s['params'] // RANKS} B a shard)",
             f"{'':26} {'sharded':>12} {'unsharded':>12} {'unsharded/sharded':>18}"]
    for label, key in rows:
        fmt = ".3f" if key == "step_s" else ".0f"
        lines.append(f"{label:26} {s[key]:>12{fmt}} {u[key]:>12{fmt}} {u[key] / s[key]:>18.2f}")
    return "\n".join(lines)


def main() -> None:
    print(table(measure(int(sys.argv[1]) if len(sys.argv) > 1 else 8)))


if __name__ == "__main__":
    main()
