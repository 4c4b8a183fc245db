"""What splitting a stage's backward into B and W costs, against one full backward (the zero-bubble
schedules' W; docs/pipeline.md).

    .venv/bin/python bench/split_backward.py [--blocks 4] [--d-model 256] [--micro-batch 4] [--seq 64] [--pairs 15]

One stage of GPT blocks on one thread; each round runs, back to back on the same weights, a full backward
and torch's split (stage_backward_input, then stage_backward_weight over its parameter groups), as the
zero-bubble schedules run it. Medians over the rounds; the ratio is to the full backward of the same
rounds, so a shared host's drift cancels.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.table import print_markdown_table  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--pairs", type=int, default=15)
    args = ap.parse_args()

    import torch
    from torch.distributed.pipelining import _backward as torch_split

    from workers.models.gpt import Block

    torch.set_num_threads(1)
    torch.manual_seed(0)
    plain = torch.nn.Sequential(*[Block(args.d_model, 4, 0.0) for _ in range(args.blocks)])
    params = list(plain.parameters())

    def forward(stage):
        x = torch.randn(args.micro_batch, args.seq, args.d_model, requires_grad=True)
        y = stage(x)
        return x, y, torch.ones_like(y)

    def full() -> tuple[float, float]:
        _, y, g = forward(plain)
        t0 = time.perf_counter()
        torch.autograd.backward(y, g)
        return time.perf_counter() - t0, 0.0

    def torchs() -> tuple[float, float]:
        x, y, g = forward(plain)
        t0 = time.perf_counter()
        _, groups = torch_split.stage_backward_input([y], [g], [x], iter(params))
        t1 = time.perf_counter()
        torch_split.stage_backward_weight(iter(params), groups)
        return t1 - t0, time.perf_counter() - t1

    kinds = {"full backward": full, "torch's split (B, then W)": torchs}
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    for round_ in range(args.pairs + 3):
        for name, run in kinds.items():
            measured = run()
            if round_ >= 3:  # warm-up rounds left out
                times[name].append(measured)
        for p in plain.parameters():
            p.grad = None
    base = statistics.median(b + w for b, w in times["full backward"])
    rows = []
    for name, ts in times.items():
        b, w = statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts)
        total = statistics.median(t[0] + t[1] for t in ts)
        rows.append([name, f"{b * 1e3:.1f}", f"{w * 1e3:.1f}" if w else "-", f"{total * 1e3:.1f}",
                     f"{total / base:.2f}"])
    print(f"{args.blocks} GPT blocks d{args.d_model}, micro-batch {args.micro_batch} x {args.seq}, one thread, "
          f"medians of {args.pairs} rounds")
    print_markdown_table(("backward", "B ms", "W ms", "B + W ms", "x full backward"), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
