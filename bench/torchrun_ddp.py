"""A plain, hand-written DDP training script: the baseline Trainyard is measured against.

    .venv/bin/torchrun --nproc-per-node 2 bench/torchrun_ddp.py --spec-json SPEC.json --out DIR

It reuses the project's model, data, loss and LR schedule modules, so the math is
the one a Trainyard worker does (same seed, same global batch of step s, same
per-rank slice and micro-batches, AdamW foreach=False, grad clip, one thread per
rank), but none of Trainyard's machinery: no Ray, no actors, no telemetry, no
checkpoints. Each rank writes DIR/rank-<r>.json with timestamps of its start-up
phases and of every finished step, which `bench/ddp_overhead.py` reads.

`ray_train_loop` is the same loop as a Ray Train `train_loop_per_worker`
(the process group is then formed by Ray Train's TorchTrainer).
"""

from __future__ import annotations

import json
import os
import sys
import time

T_PROCESS = time.time()  # before importing torch: what a plain script pays at start
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)


def run_loop(spec_json: dict, rank: int, world_size: int, out_dir: str, phases: dict[str, float]) -> dict:
    """Train `spec_json` on an initialised process group; write this rank's timings to out_dir."""
    import contextlib
    import math

    import torch
    from torch.nn.parallel import DistributedDataParallel

    from workers.data import build_datasets
    from workers.data.batches import GlobalBatches
    from workers.models import build_model
    from workers.spec import JobSpec
    from workers.training.losses import LOSSES
    from workers.training.lr_schedule import lr_at

    phases["imports_done"] = time.time()
    spec = JobSpec.model_validate(spec_json)
    torch.set_num_threads(max(1, int(spec.resources.cpus_per_worker)))
    torch.use_deterministic_algorithms(True, warn_only=True)
    train = spec.train
    dp, accum_micro = spec.dp, train.micro_batch_size

    train_set, _ = build_datasets(spec)
    batches = GlobalBatches(train_set, train.global_batch_size, train.seed)
    phases["data_loaded"] = time.time()
    model = build_model(spec)
    if train.compile:  # as Trainyard's train.compile: each repeated block compiled in place, before DDP
        from workers.models.description import describe_spec_model

        for block in describe_spec_model(model, spec.model).blocks(model):
            block.compile()
    phases["model_built"] = time.time()
    model = DistributedDataParallel(model, broadcast_buffers=False)
    phases["ddp_wrapped"] = time.time()
    optimizer = torch.optim.AdamW(model.parameters(), lr=train.lr, weight_decay=train.weight_decay, foreach=False)
    loss_fn = LOSSES[train.loss]
    max_norm = train.grad_clip if train.grad_clip is not None else math.inf

    step_ts, step_times, losses = [], [], []
    for s in range(train.steps):
        torch.manual_seed(train.seed * 1_000_003 + s * 4099 + rank)
        model.train()
        t0 = time.perf_counter()
        micro = list(batches.rank_microbatches(s, rank, dp, accum_micro))
        loss_sum = 0.0
        for i, (inputs, targets) in enumerate(micro):
            last = i == len(micro) - 1  # all-reduce once, on the last micro-batch
            with contextlib.nullcontext() if last else model.no_sync():
                loss = loss_fn(model(inputs), targets) / len(micro)
                loss.backward()
            loss_sum += loss.item()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], max_norm, foreach=False)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(train, s)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step_times.append(time.perf_counter() - t0)
        step_ts.append(time.time())
        losses.append(loss_sum)

    result = {"rank": rank, "world_size": world_size, "phases": phases, "step_ts": step_ts,
              "step_time_s": step_times, "losses": losses}
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as f:
        json.dump(result, f)
    return result


def ray_train_loop(config: dict) -> None:
    """The same loop as a Ray Train `train_loop_per_worker` (TorchTrainer formed the process group)."""
    import ray.train

    ctx = ray.train.get_context()
    phases = {"loop_entered": time.time()}
    run_loop(config["spec_json"], ctx.get_world_rank(), ctx.get_world_size(), config["out_dir"], phases)


def main() -> None:
    import argparse
    from datetime import timedelta

    import torch.distributed as dist

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec-json", required=True, help="a JobSpec as a JSON file")
    parser.add_argument("--out", required=True, help="directory for rank-<r>.json")
    args = parser.parse_args()
    phases = {"process_start": T_PROCESS}
    with open(args.spec_json) as f:
        spec_json = json.load(f)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    phases["torch_imported"] = time.time()
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=120))
    phases["process_group_ready"] = time.time()
    try:
        run_loop(spec_json, rank, world, args.out, phases)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
