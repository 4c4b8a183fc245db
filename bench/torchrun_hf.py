"""A plain, hand-written torchrun script training a Hugging Face model: the baseline for bench/hf_models.py.

    .venv/bin/torchrun --nproc-per-node 2 bench/torchrun_hf.py --spec-json SPEC.json --out DIR --layout ddp|fsdp

What a user would write without Trainyard: the model built by transformers from the spec's
`model.hf` config (seeded as Trainyard seeds it), wrapped in DDP or sharded by FSDP2
(`fully_shard` on each `model.model.layers[i]`, then the root), AdamW (foreach=False, as
Trainyard), global-norm clipping, the spec's LR schedule. The batches are the project's
(workers/data: the same global batch of step s, the same per-rank slice), so both systems
see the same data; no Trainyard strategy, telemetry, control or checkpoint code runs here.
Each rank writes DIR/rank-<r>.json with per-step timestamps (bench/ddp_runners.read_rank_files).
"""

from __future__ import annotations

import json
import os
import sys
import time

T_PROCESS = time.time()
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)


def build(spec, layout: str, mesh: str = "world"):
    """(model, optimizer) as a plain script builds them: transformers, then DDP or FSDP2.

    mesh "world" shards over the default group (what a plain script does); "3d" shards over the "dp"
    sub-mesh of a (pp, dp, tp) = (1, world, 1) mesh, the group Trainyard's FSDP uses.
    """
    import torch
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel
    from transformers import AutoConfig, AutoModelForCausalLM

    hf = spec.model.hf
    config = AutoConfig.for_model(hf.model_type, **hf.config)
    config.use_cache = False
    torch.manual_seed(spec.train.seed)  # the weights Trainyard builds from train.seed
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if layout == "ddp":
        model = DistributedDataParallel(model, broadcast_buffers=False)
    else:
        dp_mesh = None
        if mesh == "3d":
            import torch.distributed as dist
            from torch.distributed.device_mesh import init_device_mesh

            dp_mesh = init_device_mesh("cpu", (1, dist.get_world_size(), 1), mesh_dim_names=("pp", "dp", "tp"))["dp"]
        for block in model.model.layers:
            fully_shard(block, mesh=dp_mesh)
        fully_shard(model, mesh=dp_mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.train.lr, weight_decay=spec.train.weight_decay,
                                  foreach=False)
    return model, optimizer


def clip(model, max_norm: float) -> None:
    import torch
    from torch.distributed.tensor import DTensor

    norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None], max_norm,
                                          foreach=False)
    if isinstance(norm, DTensor):  # FSDP2: the global norm is a replicated DTensor
        norm = norm.full_tensor()


def run_loop(spec_json: dict, layout: str, rank: int, out_dir: str, phases: dict[str, float],
             mesh: str = "world") -> dict:
    import contextlib
    import math

    import torch
    import torch.distributed as dist
    from torch.nn import functional as F

    from workers.data import build_datasets
    from workers.data.batches import GlobalBatches
    from workers.spec import JobSpec
    from workers.training.lr_schedule import lr_at

    spec = JobSpec.model_validate(spec_json)
    torch.set_num_threads(max(1, int(spec.resources.cpus_per_worker)))
    torch.use_deterministic_algorithms(True, warn_only=True)
    train, dp = spec.train, dist.get_world_size()
    train_set, _ = build_datasets(spec)
    batches = GlobalBatches(train_set, train.global_batch_size, train.seed)
    model, optimizer = build(spec, layout, mesh)
    phases["model_built"] = time.time()
    max_norm = train.grad_clip if train.grad_clip is not None else math.inf

    step_ts, step_times, losses = [], [], []
    model.train()
    for s in range(train.steps):
        t0 = time.perf_counter()
        micro = list(batches.rank_microbatches(s, rank, dp, train.micro_batch_size))
        loss_sum = 0.0
        for i, (inputs, targets) in enumerate(micro):
            last = i == len(micro) - 1
            if layout == "fsdp":  # accumulate locally, reduce-scatter on the last micro-batch
                model.set_requires_gradient_sync(last)
            with model.no_sync() if layout == "ddp" and not last else contextlib.nullcontext():
                logits = model(inputs).logits
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)) / len(micro)
                loss.backward()
            loss_sum += loss.item()
        clip(model, max_norm)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(train, s)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step_times.append(time.perf_counter() - t0)
        step_ts.append(time.time())
        losses.append(loss_sum)

    result = {"rank": rank, "layout": layout, "phases": phases, "step_ts": step_ts, "step_time_s": step_times,
              "losses": losses}
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"rank-{rank}.json"), "w") as f:
        json.dump(result, f)
    return result


def main() -> None:
    import argparse
    from datetime import timedelta

    import torch.distributed as dist

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec-json", required=True, help="a JobSpec with model.hf, as a JSON file")
    parser.add_argument("--out", required=True, help="directory for rank-<r>.json")
    parser.add_argument("--layout", choices=("ddp", "fsdp"), default="ddp")
    parser.add_argument("--mesh", choices=("world", "3d"), default="world",
                        help="FSDP's group: the default one, or the dp sub-mesh of a (pp, dp, tp) mesh as Trainyard")
    parser.add_argument("--idle-gloo-groups", type=int, default=0,
                        help="extra gloo groups over the world, created and never used (what idle groups cost a loop: bench/notes/2026-12-05-ratio-chase.md)")
    args = parser.parse_args()
    with open(args.spec_json) as f:
        spec_json = json.load(f)
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]),
                            timeout=timedelta(seconds=120))
    idle = [dist.new_group(backend="gloo") for _ in range(args.idle_gloo_groups)]  # noqa: F841 (kept alive)
    try:
        run_loop(spec_json, args.layout, rank, args.out, {"process_start": T_PROCESS}, args.mesh)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
