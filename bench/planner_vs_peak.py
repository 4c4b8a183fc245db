"""The planner's per-rank memory (model state + activations) against the peak measured inside the steps
(workers/step_memory.py), for the layouts of tests/workers/test_strategies.py that use WORKERS ranks, on
real gloo processes (no Ray), 3 steps each (every one measured). Usage:
  PYTHONPATH=. python bench/planner_vs_peak.py 2     # or 4 (four processes)"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from tests.workers.gloo_ranks import spawn_ranks
from tests.workers.test_strategies import BASE, LAYOUTS

STEPS = 3


def _layouts(workers: int) -> dict[str, dict]:
    return {name: {k: v for k, v in layout.items() if k != "resources.workers"}
            for name, layout in LAYOUTS.items() if layout["resources.workers"] == workers}


def _measure(rank, world, port, queue, tmp):
    from tests.helpers import spec_of
    from workers.parallel.planner import estimate
    from workers.training.trainer import Trainer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    out = {}
    for name, layout in _layouts(world).items():
        spec = spec_of(**{**BASE, "checkpoint.every_steps": 0, "resources.workers": world, **layout})
        trainer = Trainer(spec, rank, world, torch.device("cpu"), Path(tmp) / name)
        peak = max(trainer.train_step().peak_memory_bytes or 0 for _ in range(STEPS))
        predicted = estimate(spec)
        out[name] = (peak, predicted.memory_bytes_per_rank, predicted.model_state_bytes_per_rank,
                     predicted.activation_bytes_per_rank)
    queue.put((rank, out))
    dist.destroy_process_group()


def main() -> None:
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    results = spawn_ranks(_measure, workers, tempfile.mkdtemp())
    print(f"{'layout':16} {'measured peak':>14} {'planner':>10} {'ratio':>6} {'state':>9} {'activations':>12}")
    for name, (peak, planned, state, act) in results[0][1].items():  # rank 0
        print(f"{name:16} {peak:>14} {planned:>10} {planned / peak:>6.2f} {state:>9} {act:>12}")


if __name__ == "__main__":
    main()
