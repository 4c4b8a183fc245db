"""The fleet's tenants and jobs: who submits what, reproducibly from a seed."""

from __future__ import annotations

import random
from dataclasses import dataclass

SIZES = (1, 2, 4, 8, 16, 32, 64)  # GPUs (= workers) per job
SIZE_WEIGHTS = (10, 10, 15, 20, 20, 15, 10)  # mean ~17 GPUs: ~470 jobs fill 8,000 GPUs
WEIGHTS = (1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 4, 4, 4, 8, 8, 1, 4)  # 20 tenants, mixed fair-share weights


@dataclass(frozen=True)
class TenantPlan:
    name: str
    weight: float
    max_workers: int | None  # its own quota (queue mode): a backlog that waits on it


@dataclass(frozen=True)
class JobPlan:
    tenant: str
    workers: int
    steps: int
    priority: int = 0


def tenants(n: int) -> list[TenantPlan]:
    """t00 is a team with a large backlog behind a small quota; the second to last submits only the
    4,096-rank job; the last is the probing team (the API load's submits, whose admission latency is
    measured)."""
    return [TenantPlan(f"t{i:02d}", float(WEIGHTS[i % len(WEIGHTS)]), 64 if i == 0 else None) for i in range(n)]


def queued_jobs(plans: list[TenantPlan], count: int, seed: int, min_steps: int, max_steps: int) -> list[JobPlan]:
    """`count` jobs over every tenant but the big job's and the probing one, interleaved in submit order;
    t00 submits a sixth of them (its backlog is far larger than any scheduler window)."""
    rng = random.Random(seed)
    teams = plans[:-2]
    shares = [count // 6] + [1] * (len(teams) - 1)
    rest = count - shares[0]
    jobs = [JobPlan(teams[0].name, rng.choices(SIZES, SIZE_WEIGHTS)[0], rng.randint(min_steps, max_steps))
            for _ in range(shares[0])]
    jobs += [JobPlan(rng.choice(teams[1:]).name, rng.choices(SIZES, SIZE_WEIGHTS)[0],
                     rng.randint(min_steps, max_steps)) for _ in range(rest)]
    rng.shuffle(jobs)
    return jobs


def spec(name: str, workers: int, steps: int, checkpoint_every: int, gpus_per_worker: int = 1) -> dict:
    """A job as a user writes it: the built-in GPT, one GPU per worker (or none: a CPU job), plain data
    parallelism."""
    return {"name": name, "model": {"name": "gpt", "n_layers": 1, "d_model": 32, "n_heads": 2, "seq_len": 32},
            "data": {"name": "text:pystdlib"},
            "train": {"steps": steps, "global_batch_size": 4 * workers, "micro_batch_size": 4, "lr": 3e-3},
            "parallel": {"dp": workers}, "checkpoint": {"every_steps": checkpoint_every},
            "resources": {"workers": workers, "cpus_per_worker": 1, "gpus_per_worker": gpus_per_worker}}
