"""CPU cost of measuring peak memory inside a step (workers/step_memory.py): one gloo rank trains a spec
and alternates blocks of steps with the storage tracker on every step and off, printing CPU (thread) time
and wall time per step. Usage: python bench/step_memory_overhead.py [dotted.key=value ...]
e.g. model.n_layers=4 model.d_model=128 model.seq_len=64 train.global_batch_size=32 train.micro_batch_size=8"""

from __future__ import annotations

import socket
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from tests.helpers import spec_of
from workers.training.trainer import Trainer

STEPS_PER_BLOCK, ROUNDS = 8, 3


def _value(text: str):
    try:
        return int(text)
    except ValueError:
        return text


def _block(trainer: Trainer, tracked: bool) -> tuple[float, float]:
    trainer.memory.every, trainer.memory.first = (1 if tracked else 0), 0
    cpu0, wall0 = time.thread_time(), time.perf_counter()
    for _ in range(STEPS_PER_BLOCK):
        trainer.train_step()
    return ((time.thread_time() - cpu0) / STEPS_PER_BLOCK * 1e3, (time.perf_counter() - wall0) / STEPS_PER_BLOCK * 1e3)


def main() -> None:
    torch.set_num_threads(1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    overrides = {k: _value(v) for k, v in (a.split("=", 1) for a in sys.argv[1:])}
    spec = spec_of(**{"resources.workers": 1, "train.steps": 1000, **overrides})
    trainer = Trainer(spec, 0, 1, torch.device("cpu"), Path(tempfile.mkdtemp()))
    for _ in range(3):  # warm-up, measured by the default schedule
        record = trainer.train_step()
    print(f"peak {record.peak_memory_bytes} B, breakdown {record.peak_memory_breakdown}, "
          f"model state {trainer.model_state_bytes} B")
    for _ in range(ROUNDS):
        (off_cpu, off_wall), (on_cpu, on_wall) = _block(trainer, False), _block(trainer, True)
        print(f"cpu ms/step off {off_cpu:.1f} on {on_cpu:.1f} (x{on_cpu / off_cpu:.2f}); "
              f"wall off {off_wall:.1f} on {on_wall:.1f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
