"""What the check at rest (workers/training/shard_integrity.py) costs per step, measured inside real steps.

Each rank of a gloo group (no Ray) builds Trainyard's own Trainer with `integrity_check_every` set, times
every seal (after the update) and every verification (before the next forward, with its one-flag
all-reduce) in place, and trains `--steps` steps after `--warmup`. Printed per layout, for the rank
where it costs most: the bytes each seal and each verification read, their median milliseconds (the
verification's checksum pass alone, and with its all-reduce, which also waits for the slower rank),
the median step time, the fractions of it, and the host's load. The seal runs inside the timed step;
the verification just before it.

    .venv/bin/python -m bench.shard_integrity_cost --layouts ddp zero2 fsdp --model small
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MODELS = {  # the tests' tiny GPT, and one with ~3.4 M parameters
    "tiny": {"model.n_layers": 1, "model.d_model": 32, "model.n_heads": 2, "model.seq_len": 32},
    "small": {"model.n_layers": 4, "model.d_model": 256, "model.n_heads": 4, "model.seq_len": 64},
}
LAYOUTS = {
    "ddp": {},
    "zero1": {"parallel.zero": 1},
    "zero2": {"parallel.zero": 2},
    "fsdp": {"parallel.zero": 3},
    "tp": {"parallel.tp": 2},
    "pipeline": {"parallel.pp": 2},
}


def _timed(fn, into: list[float]):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            into.append(time.perf_counter() - t0)
    return wrapper


def _rank(rank: int, world: int, port: int, queue, overrides: dict, steps: int, warmup: int) -> None:
    from tests.helpers import spec_of
    from workers.training.trainer import Trainer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    spec = spec_of(**{"resources.workers": world, "train.steps": steps + warmup, "train.global_batch_size": 16,
                      "train.micro_batch_size": 4, "fault_tolerance.integrity_check_every": 1000,
                      "data.max_bytes": 400_000, **overrides})
    with tempfile.TemporaryDirectory() as job:
        trainer = Trainer(spec, rank, world, torch.device("cpu"), job)
        seals: list[float] = []
        passes: list[float] = []  # the verification's own checksum pass
        verifies: list[float] = []  # ... and with its flag all-reduce (which also waits for the slower rank)
        trainer.held.held.seal = _timed(trainer.held.held.seal, seals)  # type: ignore[method-assign]
        trainer.held.held.changed = _timed(trainer.held.held.changed, passes)  # type: ignore[method-assign]
        trainer.held.verify = _timed(trainer.held.verify, verifies)  # type: ignore[method-assign]
        step_times = []
        for i in range(steps + warmup):
            record = trainer.train_step()
            if i >= warmup:
                step_times.append(record.step_time_s)
        # Checked every 1000 steps: the replica comparison never runs here, and each step has one seal (after
        # its update) and one verification (before its forward). At a checked step (every
        # integrity_check_every) one more verification runs, before the checkpoint that may follow.
        queue.put({"rank": rank, "bytes": trainer.held.held.bytes, "tensors": len(trainer.held.held.names),
                   "seal_ms": 1e3 * statistics.median(seals[warmup:]),
                   "verify_pass_ms": 1e3 * statistics.median(passes[warmup:]),
                   "verify_ms": 1e3 * statistics.median(verifies[warmup:]),
                   "step_ms": 1e3 * statistics.median(step_times)})
    dist.destroy_process_group()


def measure(layout: str, model: str, world: int, steps: int, warmup: int) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = mp.get_context("spawn").Queue()
    overrides = {**MODELS[model], **LAYOUTS[layout], **({"model.n_layers": 2} if layout == "pipeline" and
                                                          MODELS[model]["model.n_layers"] < 2 else {})}
    mp.start_processes(_rank, args=(world, port, queue, overrides, steps, warmup), nprocs=world, start_method="spawn")
    ranks = sorted((queue.get(timeout=600) for _ in range(world)), key=lambda r: r["rank"])
    worst = max(ranks, key=lambda r: (r["seal_ms"] + r["verify_ms"]) / r["step_ms"])
    return {"layout": layout, "model": model, "world": world, "bytes_per_rank": max(r["bytes"] for r in ranks),
            "tensors": worst["tensors"], "seal_ms": round(worst["seal_ms"], 3),
            "verify_pass_ms": round(worst["verify_pass_ms"], 3), "verify_ms": round(worst["verify_ms"], 3),
            "step_ms": round(worst["step_ms"], 1),
            # the two checksum passes alone, and with the verdict's all-reduce
            "fraction_passes": round((worst["seal_ms"] + worst["verify_pass_ms"]) / worst["step_ms"], 4),
            "fraction": round((worst["seal_ms"] + worst["verify_ms"]) / worst["step_ms"], 4),
            "load_avg_1m": round(os.getloadavg()[0], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layouts", nargs="+", default=["ddp", "zero2", "fsdp"], choices=sorted(LAYOUTS))
    parser.add_argument("--model", default="small", choices=sorted(MODELS))
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    for layout in args.layouts:
        print(json.dumps(measure(layout, args.model, args.world, args.steps, args.warmup)), flush=True)


if __name__ == "__main__":
    main()
