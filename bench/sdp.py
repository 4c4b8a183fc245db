"""Subnetwork data parallelism against DDP on the same model and data, measured in one run.

Run from the repository root (about 30 minutes on a loaded 2-core machine with the defaults):

    .venv/bin/python bench/sdp.py [--workers 4] [--steps 20] [--d-model 32] [--n-layers 8] [--seq-len 64]
        [--global-batch 32] [--micro-batch-size 8] [--coverages 0.75,0.5,0.375] [--json OUT]

Rows: DDP, then B-SDP and N-SDP at each coverage C with forward and backward masking
(sync every step). For each row, one `JobRun` on a local Ray at the matched step
count and one at matched FLOPs, and these columns (each also as a ratio to DDP):
  state/worker  parameters + gradients + AdamW state of worker 0 (measured tensors, bytes)
  act/worker    activation bytes one micro-batch saves for backward on worker 0 (saved-tensor hooks)
  peak          the two added: the per-worker peak the method's memory figures compare
  comm/step     logical bytes the collectives were asked to move per step (ring accounting)
  samples/s     steady-state throughput (CPU workers share cores: mostly per-op overheads)
  val@steps     validation loss of the assembled full model after --steps steps
  val@flops     the same after steps x (DDP FLOPs per step / this row's), at least --steps
FLOPs per token: 6 x params for DDP and forward masking (of the subnetwork), and
4 x full + 2 x held params for backward masking (full forward and input gradients,
weight gradients of held pieces only).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.ray_client import connect  # noqa: E402
from service.settings import Settings  # noqa: E402
from service.supervisor.run import JobRun  # noqa: E402
from workers.models import build_model  # noqa: E402
from workers.parallel.sdp.assignment import assignment_of  # noqa: E402
from workers.parallel.sdp.subnetwork import build_subnetwork  # noqa: E402
from workers.spec_loading import parse_spec  # noqa: E402


def variants(coverages: list[float]) -> dict[str, dict | None]:
    rows: dict[str, dict | None] = {"ddp": None}
    for mode, tag in (("block", "B"), ("neuron", "N")):
        for masking, suffix in (("forward", ""), ("backward", "b")):
            for c in coverages:
                rows[f"{tag}{suffix}-SDP C={c:g}"] = {"mode": mode, "masking": masking, "coverage": c}
    return rows


def spec_for(args, name: str, sdp: dict | None, steps: int):
    parallel = {"sdp": sdp} if sdp else {}
    return parse_spec({
        "name": "bench-sdp",
        "model": {"name": "gpt", "n_layers": args.n_layers, "d_model": args.d_model, "n_heads": 4,
                  "seq_len": args.seq_len},
        "data": {"name": "text:pystdlib", "max_bytes": 400_000},
        "train": {"steps": steps, "global_batch_size": args.global_batch, "micro_batch_size": args.micro_batch_size,
                  "lr": 3e-3, "warmup_steps": 2, "eval_batches": 4},
        "resources": {"workers": args.workers},
        "parallel": parallel,
    })


def worker0_model(spec):
    """Worker 0's model as the strategy builds it (the full GPT for DDP)."""
    model = build_model(spec)
    if spec.parallel.sdp is None:
        return model, sum(p.numel() for p in model.parameters())
    sub, _ = build_subnetwork(copy.deepcopy(model), assignment_of(spec), 0, spec.parallel.sdp.masking)
    return sub, sum(p.numel() for p in sub.parameters() if p.requires_grad)


def activation_bytes(model, spec) -> int:
    """Bytes of the distinct tensors autograd saves for backward over one micro-batch."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    x = torch.randint(0, spec.model.vocab_size, (spec.train.micro_batch_size, spec.model.seq_len))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(x).float().logsumexp(-1).mean()
    loss.backward()
    return sum(seen.values())


def flops_per_token(spec) -> float:
    full = sum(p.numel() for p in build_model(spec).parameters())
    if spec.parallel.sdp is None:
        return 6.0 * full
    model, trainable = worker0_model(spec)
    if spec.parallel.sdp.masking == "forward":
        return 6.0 * sum(p.numel() for p in model.parameters())
    return 4.0 * full + 2.0 * trainable


def fmt_mib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**20:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--d-model", type=int, default=32)
    ap.add_argument("--n-layers", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--micro-batch-size", type=int, default=8)
    ap.add_argument("--coverages", default="0.75,0.5,0.375")
    ap.add_argument("--only", default=None, help="comma-separated row names (ddp is always run)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    table = variants([float(c) for c in args.coverages.split(",")])
    names = [n for n in table if args.only is None or n == "ddp" or n in args.only.split(",")]
    home = Path(tempfile.mkdtemp(prefix="trainyard-bench-sdp-"))
    connect(Settings(home=home / "home"))
    ddp_flops = flops_per_token(spec_for(args, "ddp", None, args.steps))
    rows = []
    for i, name in enumerate(names):
        spec = spec_for(args, name, table[name], args.steps)
        flops = flops_per_token(spec)
        matched = max(args.steps, round(args.steps * ddp_flops / flops))
        summary = JobRun(spec, home / f"{i}-steps", name).run()
        at_flops = summary if matched == args.steps else JobRun(
            spec_for(args, name, table[name], matched), home / f"{i}-flops", name).run()
        model, _ = worker0_model(spec)
        act = activation_bytes(model, spec)
        state = summary["model_state_bytes_per_rank"]
        rows.append({
            "name": name, "state": summary["state"], "error": summary["error"],
            "state_bytes": state, "activation_bytes": act, "peak_bytes": (state or 0) + act,
            "comm_bytes": summary["comm_bytes_per_step"], "samples_per_s": summary["samples_per_s"],
            "val_at_steps": summary["final_val_loss"], "flops_steps": matched,
            "val_at_flops": at_flops["final_val_loss"], "spectral_gap": (summary.get("sdp") or {}).get("spectral_gap"),
        })
        print(f"{name}: {summary['state']} val {summary['final_val_loss']} / {at_flops['final_val_loss']} "
              f"({matched} steps)", flush=True)
    base = rows[0]

    def ratio(row, key):
        return f"{row[key] / base[key]:.2f}" if row[key] is not None and base[key] else "-"

    print(f"\nGPT n_layers={args.n_layers} d_model={args.d_model} seq_len={args.seq_len}, global batch "
          f"{args.global_batch}, micro {args.micro_batch_size}, {args.workers} CPU workers, {args.steps} steps; "
          f"MiB per worker")
    header = (f"{'variant':<18} {'state':>7} {'x':>5} {'act':>7} {'x':>5} {'peak':>7} {'x':>5} {'comm/step':>9} "
              f"{'x':>5} {'samples/s':>9} {'x':>5} {'val@steps':>9} {'x':>5} {'flops-steps':>11} {'val@flops':>9} "
              f"{'x':>5} {'gap':>5}")
    print(header)
    print("-" * len(header))
    for r in rows:
        gap = "-" if r["spectral_gap"] is None else f"{r['spectral_gap']:.2f}"
        print(f"{r['name']:<18} {fmt_mib(r['state_bytes']):>7} {ratio(r, 'state_bytes'):>5} "
              f"{fmt_mib(r['activation_bytes']):>7} {ratio(r, 'activation_bytes'):>5} "
              f"{fmt_mib(r['peak_bytes']):>7} {ratio(r, 'peak_bytes'):>5} {fmt_mib(r['comm_bytes']):>9} "
              f"{ratio(r, 'comm_bytes'):>5} {r['samples_per_s'] or 0:>9.1f} {ratio(r, 'samples_per_s'):>5} "
              f"{r['val_at_steps'] or float('nan'):>9.4f} {ratio(r, 'val_at_steps'):>5} {r['flops_steps']:>11} "
              f"{r['val_at_flops'] or float('nan'):>9.4f} {ratio(r, 'val_at_flops'):>5} {gap:>5}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
