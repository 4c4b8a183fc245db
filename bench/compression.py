"""DDP gradient compression side by side: none, fp16, powersgd, onebit, signsgd (and each of the last two with
its other error-feedback setting), measured in one run.

Run from the repository root (a few minutes on a 2-core machine with the defaults):

    .venv/bin/python bench/compression.py [--workers 2] [--steps 60] [--d-model 64] [--n-layers 2]
        [--seq-len 64] [--global-batch 16] [--micro-batch-size 8] [--powersgd-rank 2] [--only onebit,...]
        [--json OUT]

Each row is one `JobRun` of the built-in GPT on a local Ray (same seed, data, global batch and steps):
bytes on the wire per step (`comm_bytes_per_step`, the median step: what one rank sends, a ring
all-reduce 2(k-1)/k of the buffer, an all-gather k-1 messages), their ratio to DDP's fp32 all-reduce,
the steady step time and its ratio to DDP's, and the final training loss and its ratio to DDP's.
On a CPU machine the ranks share cores over loopback: the step-time ratio shows what encoding and
decoding cost, not what fewer bytes save on a slow link.
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
from workers.spec_loading import parse_spec  # noqa: E402


def kinds(args) -> dict[str, dict | None]:
    return {
        "none": None,
        "fp16": {"kind": "fp16"},
        "powersgd": {"kind": "powersgd", "rank": args.powersgd_rank},
        "onebit": {"kind": "onebit"},
        "signsgd": {"kind": "signsgd"},
        # the other error-feedback setting of each (defaults: onebit with, signsgd without)
        "onebit-noef": {"kind": "onebit", "error_feedback": False},
        "signsgd-ef": {"kind": "signsgd", "error_feedback": True},
    }


def spec_for(args, name: str, compression: dict | None):
    parallel = {} if compression is None else {"compression": compression}
    return parse_spec({
        "name": f"bench-compression-{name}",
        "model": {"name": "gpt", "n_layers": args.n_layers, "d_model": args.d_model, "n_heads": 4,
                  "seq_len": args.seq_len},
        "data": {"name": "text:pystdlib", "max_bytes": 400_000},
        "train": {"steps": args.steps, "global_batch_size": args.global_batch,
                  "micro_batch_size": args.micro_batch_size, "lr": 3e-3, "warmup_steps": 5, "seed": 0},
        "resources": {"workers": args.workers},
        "parallel": parallel,
    })


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--n-layers", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--micro-batch-size", type=int, default=8)
    ap.add_argument("--powersgd-rank", type=int, default=2)
    ap.add_argument("--only", default=None, help="comma-separated kinds (none is always run: the baseline)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    table = kinds(args)
    names = args.only.split(",") if args.only else list(table)
    if "none" not in names:
        names.insert(0, "none")
    home = Path(tempfile.mkdtemp(prefix="trainyard-bench-compression-"))
    connect(Settings(home=home / "home"))
    rows = []
    for name in names:
        summary = JobRun(spec_for(args, name, table[name]), home / name, name).run()
        steady = summary["samples_per_s"]
        rows.append({"kind": name, "state": summary["state"], "comm_bytes": summary["comm_bytes_per_step"],
                     "step_ms": 1e3 * args.global_batch / steady if steady else None,
                     "final_loss": summary["final_loss"],
                     "ratio_reported": (summary.get("compression") or {}).get("ratio")})
        print(f"{name}: {summary['state']} {summary['comm_bytes_per_step']} B/step", flush=True)
    base = rows[0]

    def ratio(row, key):
        return row[key] / base[key] if row[key] is not None and base[key] else None

    for r in rows:
        r.update(bytes_vs_ddp=ratio(r, "comm_bytes"), step_time_vs_ddp=ratio(r, "step_ms"),
                 loss_vs_ddp=ratio(r, "final_loss"))

    def num(x, fmt):
        return "-" if x is None else format(x, fmt)

    print(f"\nGPT n_layers={args.n_layers} d_model={args.d_model} seq_len={args.seq_len}, global batch "
          f"{args.global_batch}, micro {args.micro_batch_size}, {args.workers} CPU workers, {args.steps} steps")
    header = (f"{'kind':<12} {'bytes/step':>11} {'x fp32 DDP':>10} {'step ms':>8} {'x DDP':>6} "
              f"{'final loss':>10} {'x DDP':>6}")
    print(header)
    print("-" * len(header))
    for r in rows:
        print(f"{r['kind']:<12} {num(r['comm_bytes'], '>11.0f')} {num(r['bytes_vs_ddp'], '>10.4f')} "
              f"{num(r['step_ms'], '>8.1f')} {num(r['step_time_vs_ddp'], '>6.2f')} "
              f"{num(r['final_loss'], '>10.4f')} {num(r['loss_vs_ddp'], '>6.3f')}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
