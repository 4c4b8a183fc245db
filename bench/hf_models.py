"""Your own model: Trainyard against a plain torchrun script, on a Hugging Face Llama (DDP and FSDP2).

Run from the repository root (about 8-10 minutes on a 2-core machine with the defaults):

    .venv/bin/python bench/hf_models.py [--steps 20] [--reps 3] [--layouts ddp,fsdp] [--json OUT.json]

One HF Llama (hidden 512, 4 layers, intermediate 1376, 8 heads / 4 kv heads, vocab 256:
11.9 M parameters), the byte-level stdlib text at seq_len 128, global batch 8 in
micro-batches of 4, 2 workers with one CPU thread each, trained per layout by
  A. Trainyard: `JobRun(spec).run()`, what `trainyard run SPEC --json` does, on a local Ray
     that this process starts once before any measurement;
  B. torchrun: `torchrun --nproc-per-node 2 bench/torchrun_hf.py --layout L`, a hand-written
     loop that builds the model with transformers and applies DDP or FSDP2 itself.
Runs are interleaved in pairs (A B, B A, A B, ...; ddp then fsdp in each rep) so that the shared
machine's load and its drift hit both alike; the ratio is taken within each pair. samples/s is steady
state from per-step finish timestamps (first 20% of steps skipped): G x steps / elapsed.
Single pairs spread several percent here, so the table gives the median ratio's 90% interval
(bench/median_interval.py) and says whether the target is met, missed, or undecided at this many
pairs; `--pool A.json B.json` adds the pairs of earlier runs of the same workload (`--reps 0`: only those).
Model-state bytes per rank are Trainyard's own measurement (parameters + gradients + AdamW
state) against ZeRO's formulas for fp32 AdamW: DDP 16 B/param, FSDP 16/K B/param.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.ddp_runners import run_torchrun, run_trainyard, start_ray  # noqa: E402
from bench.median_interval import median_interval  # noqa: E402
from bench.table import print_markdown_table  # noqa: E402

LLAMA = {"hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 4, "num_attention_heads": 8,
         "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 128}
WORKERS = 2
ZERO_BYTES_PER_PARAM = {"ddp": 16.0, "fsdp": 16.0 / WORKERS}  # fp32 params + grads + AdamW m and v
PARALLEL = {"ddp": {"dp": WORKERS}, "fsdp": {"dp": WORKERS, "zero": 3}}
TARGET = 0.98  # Trainyard / torchrun samples/s


def make_spec(layout: str, steps: int, seq_len: int, global_batch: int, micro_batch: int):
    from workers.spec import JobSpec

    return JobSpec.model_validate({
        "name": f"bench-hf-{layout}",
        "model": {"hf": {"model_type": "llama", "config": {**LLAMA, "max_position_embeddings": seq_len}}},
        "data": {"name": "text:pystdlib", "seq_len": seq_len},
        "train": {"steps": steps, "global_batch_size": global_batch, "micro_batch_size": micro_batch, "lr": 1e-3,
                  "warmup_steps": min(5, steps), "seed": 0, "loss": "cross_entropy"},
        "parallel": PARALLEL[layout],
        "resources": {"workers": WORKERS, "cpus_per_worker": 1},
        "checkpoint": {"every_steps": 0, "keep": 1},  # only the final one, after the timed steps
        "fault_tolerance": {"max_restarts": 0},
    })


def count_parameters(spec) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(spec.model.hf.model_type, **spec.model.hf.config)
    with torch.device("meta"):
        return sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())


def spread(values: list[float], spec: str = ".2f") -> str:
    """median [min-max]"""
    return f"{statistics.median(values):{spec}} [{min(values):{spec}}-{max(values):{spec}}]"


def print_table(pairs_by_layout: dict[str, list[dict]], n_params: int) -> None:
    head = ("layout", "Trainyard samples/s", "torchrun samples/s", "ratio (pairs)", "median's 90% interval",
            f">= {TARGET}", "model state B/rank", "ZeRO formula", "measured/formula")
    body = []
    for layout, pairs in pairs_by_layout.items():
        if not pairs:
            continue
        measured = pairs[-1]["state_bytes"]
        formula = ZERO_BYTES_PER_PARAM[layout] * n_params
        ratios = [p["ratio"] for p in pairs]
        interval = median_interval(ratios)
        body.append((f"{layout} (K={WORKERS})", spread([p["trainyard_sps"] for p in pairs]),
                     spread([p["torchrun_sps"] for p in pairs]), spread(ratios, ".3f"),
                     f"[{interval.low:.3f}-{interval.high:.3f}] ({interval.coverage:.0%}, n={interval.n})",
                     interval.verdict(TARGET).value, f"{measured:,}", f"{formula:,.0f}", f"{measured / formula:.3f}"))
    print_markdown_table(head, body)


WORKLOAD = ("steps", "seq_len", "global_batch", "micro_batch", "num_cpus")  # what makes pairs comparable


def pooled_pairs(files: list[Path], args: argparse.Namespace, layouts: list[str]) -> dict[str, list[dict]]:
    """The pairs of earlier runs of this same workload, by layout; a file of another workload is refused."""
    pooled: dict[str, list[dict]] = {lay: [] for lay in layouts}
    for file in files:
        earlier = json.loads(file.read_text())
        differs = {k: (earlier["args"].get(k), getattr(args, k)) for k in WORKLOAD
                   if earlier["args"].get(k) != getattr(args, k)}
        if differs:
            raise SystemExit(f"--pool {file}: another workload (earlier, now): {differs}")
        for lay in layouts:
            pooled[lay] += earlier["pairs"].get(lay, [])
    return pooled


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="training steps per run (first 20%% not timed)")
    parser.add_argument("--reps", type=int, default=6, help="interleaved Trainyard/torchrun pairs per layout")
    parser.add_argument("--layouts", default="ddp,fsdp", help="comma-separated: ddp, fsdp")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--num-cpus", type=int, default=8, help="logical CPUs of the local Ray")
    parser.add_argument("--json", type=Path, help="also write every measurement here")
    parser.add_argument("--pool", type=Path, nargs="*", default=[],
                        help="earlier --json outputs of the same workload whose pairs join this run's in the table "
                             "(--reps 0: the table of those alone)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=FutureWarning)
    import ray

    layouts = [x.strip() for x in args.layouts.split(",") if x.strip()]
    specs = {lay: make_spec(lay, args.steps, args.seq_len, args.global_batch, args.micro_batch) for lay in layouts}
    n_params = count_parameters(next(iter(specs.values())))
    work = Path(tempfile.mkdtemp(prefix="trainyard-bench-hf-"))
    res: dict = {"args": vars(args) | {"json": str(args.json)}, "n_params": n_params,
                 "pairs": {lay: [] for lay in layouts}, "loadavg_before": os.getloadavg()}
    pooled = pooled_pairs(args.pool, args, layouts)
    t_bench = time.time()
    try:
        res["ray_init_s"] = start_ray(args.num_cpus) if args.reps else 0.0
        for rep in range(args.reps):
            for lay in layouts:
                spec = specs[lay]
                spec_file = work / f"spec-{lay}.json"
                spec_file.write_text(json.dumps(spec.model_dump(mode="json")))
                # ABBA: odd reps run torchrun first, so a host that drifts faster or slower over a pair
                # does not always favour the same side.
                runs = {"a": lambda: run_trainyard(spec, work, f"trainyard-{lay}-{rep}"),
                        "b": lambda: run_torchrun(spec, spec_file, work, f"torchrun-{lay}-{rep}", "torchrun_hf.py",
                                                  ("--layout", lay))}
                done = {k: runs[k]() for k in ("ab" if rep % 2 == 0 else "ba")}
                a, b = done["a"], done["b"]
                pair = {"trainyard_sps": a["sps"], "torchrun_sps": b["sps"], "ratio": a["sps"] / b["sps"],
                        "state_bytes": a["summary"]["model_state_bytes_per_rank"],
                        "trainyard_final_loss": a["final_loss"], "torchrun_final_loss": b["final_loss"],
                        "params_sha256": a["summary"]["params_sha256"], "loadavg": os.getloadavg()[0],
                        "steady_windows": {"trainyard": a["steady_window"], "torchrun": b["steady_window"]}}
                res["pairs"][lay].append(pair)
                print(f"rep {rep} {lay}: Trainyard {a['sps']:.2f} samples/s | torchrun {b['sps']:.2f} samples/s | "
                      f"ratio {pair['ratio']:.3f} | final loss {a['final_loss']:.4f} vs {b['final_loss']:.4f} | "
                      f"load {pair['loadavg']:.1f}", flush=True)
    finally:
        ray.shutdown()
        res["loadavg_after"] = os.getloadavg()
        shutil.rmtree(work, ignore_errors=True)

    table = {lay: pooled[lay] + res["pairs"][lay] for lay in layouts}  # --json keeps this run's own pairs
    print()
    if args.pool:
        print(f"pooled with the pairs of {', '.join(map(str, args.pool))}: "
              + ", ".join(f"{len(pooled[lay])} earlier {lay} pairs" for lay in layouts))
    print(f"HF Llama {n_params / 1e6:.1f} M params (hidden {LLAMA['hidden_size']}, {LLAMA['num_hidden_layers']} "
          f"layers), seq_len {args.seq_len}, global batch {args.global_batch} (micro {args.micro_batch}), "
          f"{WORKERS} workers x 1 CPU thread, {args.steps} steps, {args.reps} interleaved pairs per layout; "
          f"load average before {res['loadavg_before'][0]:.1f}, after {res['loadavg_after'][0]:.1f}")
    print_table(table, n_params)
    print(f"ratio = Trainyard / torchrun samples/s within each pair: median [min-max]; the median's interval is "
          f"distribution-free (bench/median_interval.py); >= {TARGET}: met / missed when the whole interval is on "
          f"one side, undecided when it straddles the target")
    print(f"bench wall time {time.time() - t_bench:.0f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
