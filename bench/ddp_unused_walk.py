"""What DDP's find_unused_parameters=True (workers/parallel/data_parallel/reducers.py: one bucket layout for every step,
so a resumed attempt sums gradients in the same order) costs a step, against the default, in one run.

    .venv/bin/python bench/ddp_unused_walk.py [--ranks 2] [--steps 30] [--rounds 3]

Two gloo ranks train the same small MLP stack both ways, rounds interleaved; prints the median step
time of each and their ratio (the flag's cost is one walk of the autograd graph per step).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    layers = []
    for _ in range(12):
        layers += [torch.nn.Linear(256, 256), torch.nn.GELU()]
    return torch.nn.Sequential(*layers)


def _steps(ddp: DistributedDataParallel, steps: int) -> float:
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    x = torch.randn(64, 256)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[3:])


def _rank(rank: int, world: int, port: int, steps: int, rounds: int, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    result = {False: [], True: []}
    for _ in range(rounds):
        for flag in (False, True):
            result[flag].append(_steps(DistributedDataParallel(_model(), find_unused_parameters=flag), steps))
    if rank == 0:
        out.put({k: statistics.median(v) for k, v in result.items()})
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, a.ranks, 29611, a.steps, a.rounds, out)) for r in range(a.ranks)]
    for proc in procs:
        proc.start()
    medians = out.get(timeout=600)
    for proc in procs:
        proc.join()
    print("| DDP | median step ms |\n|---|---:|")
    print(f"| default (buckets rebuilt after step 1) | {medians[False] * 1e3:.2f} |")
    print(f"| find_unused_parameters=True | {medians[True] * 1e3:.2f} |")
    print(f"ratio (flag / default): {medians[True] / medians[False]:.3f}")


if __name__ == "__main__":
    main()
