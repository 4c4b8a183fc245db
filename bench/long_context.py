"""Context parallelism (parallel.cp) through the product's own step: how long a sequence fits a per-rank
memory budget, and what the job's throughput and per-rank activation peak are at a fixed long sequence,
for cp = 1, 2, 4.

Run from the repository root (about 1-2 minutes on a 2-core host with the defaults):

    PYTHONPATH=. .venv/bin/python bench/long_context.py [--budget-mib 64] [--max-seq 8192] [--seq 1024]
        [--steps 6] [--cp 1 2 4] [--json OUT.json]

The built-in GPT (d_model 64, 2 layers, 4 heads, vocab 256, dropout 0), micro-batch 1, global batch 1:
one sequence per step, split over the cp ranks (DDP over dp x cp = cp ranks, dp 1), on spawned gloo
ranks (no Ray), one intra-op thread each. Each (cp, sequence length) builds the job afresh (parse_spec,
build_model, ReplicateStep.wrap -> parallelize -> context parallelism) and runs the job's step
(bench/axes_step.py): forward_backward (the rank's two load-balanced chunks; ring attention), global-norm
clipping, the AdamW update.

Measured:
  - peak: the per-rank step peak of tensor storage bytes, by the product's own StepMemory (the
    StorageTracker the job's step records report on CPU): the largest over the process's first 3 steps
    (all measured; the first update creates the AdamW state) and over the cp ranks. Peaks, not means.
    "act" is the activations category's own peak. Exact: they count bytes, not time.
  - longest seq in budget: sequence lengths 256, 512, ... up to --max-seq are measured in order; the
    longest whose peak is <= --budget-mib. Each cp stops after the first length over the budget.
  - at --seq: peak, activation peak and their ratios to cp1; tokens/s of the job = seq tokens per step /
    the median over --steps unmeasured steps of the slowest rank's step wall time; ratio to cp1.
  - planner: workers/parallel/planner.estimate's predicted per-rank peak for the same spec, next to
    the measured one (the memory-fit admission reads it).

On the shared 2-core host the cp ranks share the cores (cp4: 4 processes on 2 cores), so tokens/s and its
ratios are host-limited and say nothing about cp's speed on separate devices; the peaks are exact.
tests/bench/test_long_context.py runs a tiny configuration and checks the table's relations.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from bench.axes_step import RankJob, gpt_spec, init_rank  # noqa: E402
from bench.table import print_markdown_table  # noqa: E402
from tests.workers.gloo_ranks import spawn_ranks  # noqa: E402

MIB = 2**20
HOST_CAVEAT = ("tokens/s: the cp ranks share this host's cores (2 shared cores; cp4 = 4 processes), so "
               "tokens/s and its ratios are host-limited; the peaks are exact (bytes counted, not timed).")


def spec_for(seq: int, cp: int, width: dict) -> dict:
    return gpt_spec(seq, cp, {"cp": cp}, global_batch=1, micro_batch=1, **width)


def _rank(rank, world, port, queue, seqs, budget_bytes, seq, steps, width):
    init_rank(rank, world, port)
    out = {}
    for s in seqs:
        job = RankJob(spec_for(s, world, width), rank, world)
        measured = [job.step() for _ in range(3)]  # StepMemory measures a process's first 3 steps
        row = {"peak": max(r.peak_bytes for r in measured), "act": max(r.peak_activation_bytes for r in measured),
               "state": measured[-1].model_state_bytes, "rank_tokens": measured[-1].tokens}
        if s == seq:
            timed = [job.step() for _ in range(steps)]
            assert all(r.peak_bytes is None for r in timed), "a timed step was tracked"
            row["walls"] = [r.wall_s for r in timed]
        out[s] = row
        del job
        worst = torch.tensor([row["peak"]], dtype=torch.int64)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)  # every rank stops at the same length
        if int(worst) > budget_bytes and s >= seq:
            break
    queue.put((rank, out))
    dist.destroy_process_group()


def lengths(max_seq: int, start: int = 256) -> list[int]:
    out, s = [], start
    while s <= max_seq:
        out.append(s)
        s *= 2
    return out


def measure(cps: list[int], budget_mib: float, max_seq: int, seq: int, steps: int, width: dict,
            start: int = 256) -> dict:
    """cp -> {"sweep": {seq: {peak, act, state, rank_tokens}}, "seq_row": ..., "walls": [slowest rank per step]}."""
    from workers.parallel.planner import estimate
    from workers.spec_loading import parse_spec

    seqs = sorted(set(lengths(max_seq, start)) | {seq})
    results: dict = {}
    for cp in cps:
        t0 = time.perf_counter()
        ranks = spawn_ranks(_rank, cp, seqs, int(budget_mib * MIB), seq, steps, width)
        sweep: dict[int, dict] = {}
        for _, out in ranks:
            for s, row in out.items():
                cur = sweep.setdefault(s, {"peak": 0, "act": 0, "state": 0, "rank_tokens": row["rank_tokens"]})
                for k in ("peak", "act", "state"):
                    cur[k] = max(cur[k], row[k])  # the worst rank's
        for s, row in sweep.items():
            row["planner"] = estimate(parse_spec(spec_for(s, cp, width))).memory_bytes_per_rank
        walls = [max(w) for w in zip(*(out[seq]["walls"] for _, out in ranks))]
        results[cp] = {"sweep": sweep, "walls": walls, "elapsed_s": time.perf_counter() - t0}
    return results


def longest_in_budget(sweep: dict, budget_bytes: float) -> int | None:
    """The longest length such that it and every shorter one measured fit; None if the shortest does not."""
    best = None
    for s, row in sorted(sweep.items()):
        if row["peak"] > budget_bytes:
            break
        best = s
    return best


def rows(results: dict, budget_mib: float, seq: int) -> list[dict]:
    base = results[min(results)]
    base_row, base_tps = base["sweep"][seq], seq / statistics.median(base["walls"])
    out = []
    for cp, res in results.items():
        row = res["sweep"][seq]
        tps = seq / statistics.median(res["walls"])
        out.append({"cp": cp, "longest_in_budget": longest_in_budget(res["sweep"], budget_mib * MIB),
                    "peak_mib": row["peak"] / MIB, "peak_ratio": row["peak"] / base_row["peak"],
                    "act_mib": row["act"] / MIB, "act_ratio": row["act"] / base_row["act"],
                    "planner_mib": row["planner"] / MIB, "rank_tokens": row["rank_tokens"],
                    "tokens_per_s": tps, "tokens_per_s_ratio": tps / base_tps})
    return out


HEAD = ("cp", "longest seq in budget", "peak MiB at S", "peak / cp1", "act peak MiB at S", "act / cp1",
        "planner MiB at S", "tokens/rank", "tokens/s", "tokens/s / cp1")


def print_tables(results: dict, budget_mib: float, seq: int) -> None:
    body = [[str(r["cp"]), str(r["longest_in_budget"] or f"< {min(results[r['cp']]['sweep'])}"),
             f"{r['peak_mib']:.1f}", f"{r['peak_ratio']:.2f}", f"{r['act_mib']:.1f}", f"{r['act_ratio']:.2f}",
             f"{r['planner_mib']:.1f}", str(r["rank_tokens"]), f"{r['tokens_per_s']:.0f}",
             f"{r['tokens_per_s_ratio']:.2f}"] for r in rows(results, budget_mib, seq)]
    print(f"budget {budget_mib:g} MiB per rank; S = {seq}")
    print_markdown_table(HEAD, body)
    print()
    seqs = sorted({s for res in results.values() for s in res["sweep"]})
    head = ["seq"] + [f"cp{cp} peak MiB (planner)" for cp in results]
    body = []
    for s in seqs:
        cells = [str(s)]
        for res in results.values():
            row = res["sweep"].get(s)
            cells.append("-" if row is None else f"{row['peak'] / MIB:.1f} ({row['planner'] / MIB:.1f})")
        body.append(cells)
    print("measured per-rank step peak by sequence length (planner's prediction in brackets; '-': not run, "
          "a shorter length was over the budget already)")
    print_markdown_table(head, body)
    print()
    print(HOST_CAVEAT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cp", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--budget-mib", type=float, default=64.0, help="per-rank step peak budget (MiB)")
    parser.add_argument("--max-seq", type=int, default=8192)
    parser.add_argument("--start-seq", type=int, default=256)
    parser.add_argument("--seq", type=int, default=1024, help="the fixed long sequence of the throughput columns")
    parser.add_argument("--steps", type=int, default=6, help="timed (unmeasured) steps at --seq")
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--json", type=Path, help="also write every measurement here")
    args = parser.parse_args()
    width = {"d_model": args.d_model, "n_layers": args.layers, "n_heads": args.heads}
    t0 = time.perf_counter()
    results = measure(args.cp, args.budget_mib, args.max_seq, args.seq, args.steps, width, args.start_seq)
    print(f"GPT d_model {args.d_model}, {args.layers} layers, {args.heads} heads; micro-batch 1; "
          f"DDP over the cp ranks; {time.perf_counter() - t0:.0f} s")
    print_tables(results, args.budget_mib, args.seq)
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "rows": rows(results, args.budget_mib, args.seq),
                                         "results": results, "host_caveat": HOST_CAVEAT}, indent=2, default=str))


if __name__ == "__main__":
    main()
