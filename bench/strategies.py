"""Parallel strategies side by side on the same model and global batch, measured in one run.

Run from the repository root (about 10 minutes on a 2-core machine with the defaults):

    .venv/bin/python bench/strategies.py [--workers 4] [--steps 16] [--d-model 128] [--n-layers 4]
        [--seq-len 64] [--global-batch 32] [--micro-batch-size 8] [--only ddp,zero1,...] [--json OUT]

Each row is one `JobRun` on a local Ray: samples/s and step time (steady state:
the first 20% of steps skipped), model-state bytes of rank 0 (parameters,
gradients, optimiser state, measured from the tensors), logical communication
bytes per step (what the collectives were asked to move), each also as a ratio
to the DDP row, and the planner's predicted bytes beside the measured ones.
Loss after the last step is printed so that a broken layout shows.
On a CPU machine the workers share cores, so time ratios mostly show
communication and per-op overheads, not what an accelerator would see.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.ray_client import connect  # noqa: E402
from service.settings import Settings  # noqa: E402
from service.supervisor.run import JobRun  # noqa: E402
from workers.parallel.planner import estimate  # noqa: E402
from workers.spec_loading import parse_spec  # noqa: E402


def layouts(workers: int) -> dict[str, dict]:
    half = workers // 2
    return {
        "ddp": {},
        "zero1": {"zero": 1},
        "zero2": {"zero": 2},
        "fsdp": {"zero": 3},
        "fsdp-keep": {"zero": 3, "reshard_after_forward": False},
        "hsdp": {"zero": 3, "dp_shard": half},
        f"dp{half}xtp2": {"tp": 2},
        f"dp{half}xtp2-sp": {"tp": 2, "sequence_parallel": True},
        f"fsdp{half}xtp2": {"tp": 2, "zero": 3},
        f"tp{workers}": {"tp": workers},
        "ddp-fp16": {"compression": {"kind": "fp16"}},
        "ddp-powersgd": {"compression": {"kind": "powersgd", "rank": 4}},
        "ddp-onebit": {"compression": {"kind": "onebit"}},
        "ddp-signsgd": {"compression": {"kind": "signsgd"}},
        "local-sgd-4": {"local_sgd": {"period": 4}},
        "ddp-bf16": {"mixed_precision": "bf16"},
        "fsdp-ac": {"zero": 3, "activation_checkpointing": True},
    }


def spec_for(args, name: str, parallel: dict):
    return parse_spec({
        "name": f"bench-{name}",
        "model": {"name": "gpt", "n_layers": args.n_layers, "d_model": args.d_model, "n_heads": 4,
                  "seq_len": args.seq_len},
        "data": {"name": "text:pystdlib", "max_bytes": 400_000},
        "train": {"steps": args.steps, "global_batch_size": args.global_batch,
                  "micro_batch_size": args.micro_batch_size, "lr": 1e-3, "lr_schedule": "constant"},
        "resources": {"workers": args.workers},
        "parallel": parallel,
    })


def fmt_bytes(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.2f} MiB"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--n-layers", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--micro-batch-size", type=int, default=8)
    ap.add_argument("--only", default=None, help="comma-separated row names")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    table = layouts(args.workers)
    names = args.only.split(",") if args.only else list(table)
    if "ddp" not in names:
        names.insert(0, "ddp")  # the baseline of every ratio
    home = Path(tempfile.mkdtemp(prefix="trainyard-bench-strategies-"))
    connect(Settings(home=home / "home"))
    rows = []
    for name in names:
        spec = spec_for(args, name, table[name])
        summary = JobRun(spec, home / name, name).run()
        predicted = estimate(spec)
        steady = summary["samples_per_s"]
        rows.append({
            "name": name, "strategy": summary["layout"]["strategy"], "state": summary["state"],
            "samples_per_s": steady, "step_ms": 1e3 * args.global_batch / steady if steady else None,
            "model_state_bytes": summary["model_state_bytes_per_rank"],
            "comm_bytes": summary["comm_bytes_per_step"],
            "predicted_state_bytes": predicted.model_state_bytes_per_rank,
            "predicted_comm_bytes": predicted.comm_bytes_per_step,
            "final_loss": summary["final_loss"],
        })
        print(f"{name}: {summary['state']} {steady or 0:.1f} samples/s", flush=True)
    base = rows[0]

    def ratio(row, key):
        return f"{row[key] / base[key]:.2f}" if row[key] is not None and base[key] else "-"

    header = (f"{'layout':<14} {'strategy':<9} {'samples/s':>9} {'x ddp':>6} {'step ms':>8} {'state/rank':>11} "
              f"{'x ddp':>6} {'(planned)':>11} {'comm/step':>11} {'x ddp':>6} {'(planned)':>11} {'loss':>7}")
    print(f"\nGPT n_layers={args.n_layers} d_model={args.d_model} seq_len={args.seq_len}, "
          f"global batch {args.global_batch}, micro {args.micro_batch_size}, {args.workers} CPU workers, "
          f"{args.steps} steps")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['name']:<14} {r['strategy']:<9} {r['samples_per_s'] or 0:>9.1f} {ratio(r, 'samples_per_s'):>6} "
              f"{r['step_ms'] or 0:>8.1f} {fmt_bytes(r['model_state_bytes']):>11} {ratio(r, 'model_state_bytes'):>6} "
              f"{fmt_bytes(r['predicted_state_bytes']):>11} {fmt_bytes(r['comm_bytes']):>11} "
              f"{ratio(r, 'comm_bytes'):>6} {fmt_bytes(r['predicted_comm_bytes']):>11} "
              f"{r['final_loss'] or float('nan'):>7.4f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
