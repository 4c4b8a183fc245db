"""Expert parallelism (parallel.ep) through the product's own step: throughput, all-to-all traffic, expert
load imbalance and per-rank model state for ep = 1, 2, 4 on dp = 4 ranks.

Run from the repository root (about 1 minute on a 2-core host with the defaults):

    PYTHONPATH=. .venv/bin/python bench/moe.py [--ep 1 2 4] [--seq 128] [--global-batch 16]
        [--micro-batch 2] [--steps 6] [--json OUT.json]

The built-in GPT with model.moe {experts 8, top_k 2} (d_model 64, 2 layers, 4 heads, no capacity limit),
4 spawned gloo ranks (no Ray), one intra-op thread each, DDP over dp 4 (the ep groups are consecutive
ranks inside dp: ParallelDims' (dp_mod_ep, ep)). Each ep builds the job (parse_spec, build_model,
ReplicateStep.wrap -> parallelize -> expert parallelism) and runs the job's step (bench/axes_step.py):
forward_backward with the MoE load-balancing loss (with_aux_loss, as the trainer), the expert-gradient
all-reduce over dp_mod_ep, global-norm clipping, the AdamW update. Every ep sees the same batches and
starts from the same weights, so the routing is the same: only where the experts run changes.

Measured per step (3 tracked steps, then --steps untracked ones that are timed):
  - tokens/s of the job: global batch x seq / the median of the slowest rank's step wall time.
  - all-to-all MiB per rank per step: the product's `all_to_all_bytes(model)` read after every micro-batch's
    forward (counts + token rows, both ways), plus the backward's token rows (the reverse all-to-all of
    the same rows; the counts are not sent again); the largest rank. "metered" counts what this rank gave
    to torch.distributed.all_to_all_single for other ranks, forward and backward, as a check.
  - imbalance: per MoE layer, the step's routed assignments per expert (`tokens_per_expert`, summed over
    micro-batches and over the 4 ranks): max / mean; the worst layer; step 1's (the same weights and batch
    under every ep, so the same routing) and the worst step's.
    "busiest ep rank": per ep group, the assignments an expert owner receives (its experts' sums over the
    group's ranks), max / mean over owners, the worst group and layer: the work the slowest owner does.
  - expert replicas agree: after the steps, every rank holds the same expert values as the other ranks at
    its place in the ep group (r % ep), i.e. the expert gradients were reduced over their replicas.
  - model state per rank: parameters + gradients + AdamW state held after the update (workers.telemetry.
    model_state_bytes, what the job reports), the largest rank; ratio to ep1. Peak: the StepMemory peak.

On the shared 2-core host the 4 ranks share the cores, so tokens/s and its ratios are host-limited (the
expert matmuls of a rank do not run beside another rank's); bytes are exact.
tests/bench/test_moe.py runs a tiny configuration and checks the table's relations.
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
HOST_CAVEAT = ("tokens/s: the 4 ranks share this host's 2 shared cores, so tokens/s and its ratios are "
               "host-limited; bytes (all-to-all, model state, peaks) and the imbalance are exact.")


def spec_for(ep: int, workers: int, seq: int, global_batch: int, micro_batch: int, experts: int, top_k: int) -> dict:
    return gpt_spec(seq, workers, {"ep": ep}, global_batch, micro_batch, moe={"experts": experts, "top_k": top_k})


class Meter:
    """What one step's micro-batches sent and routed, read right after each forward."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.forward_bytes = 0  # the product's all_to_all_bytes, summed over micro-batches
        self.backward_bytes = 0  # the token rows the backward sends back again
        self.counts: list[torch.Tensor] | None = None  # per MoE layer, routed assignments per expert
        self.metered = 0

    def after_forward(self, model) -> None:
        from workers.models.moe import MoE
        from workers.parallel.expert_parallel import ExpertParallelDispatch, all_to_all_bytes

        layers = [m for m in model.modules() if isinstance(m, MoE)]
        fwd = all_to_all_bytes(model)
        self.forward_bytes += fwd
        # the counts exchange ([experts] int64, less this rank's own slice) happens in the forward only
        counts = sum((m.experts - m.local_experts) * 8 for m in layers
                     if isinstance(m.dispatch, ExpertParallelDispatch))
        self.backward_bytes += fwd - counts
        routed = [m.tokens_per_expert.clone() for m in layers if m.tokens_per_expert is not None]
        self.counts = routed if self.counts is None else [a + b for a, b in zip(self.counts, routed)]

    def wrap_all_to_all(self) -> None:
        """Count what this rank hands torch.distributed.all_to_all_single for other ranks."""
        original = dist.all_to_all_single

        def metered(output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False):
            size, me = dist.get_world_size(group), dist.get_rank(group)
            row = input.element_size() * (input[0].numel() if input.dim() else 1)
            splits = input_split_sizes or [input.shape[0] // size] * size
            self.metered += row * (sum(splits) - splits[me])
            return original(output, input, output_split_sizes, input_split_sizes, group, async_op)

        dist.all_to_all_single = metered


def _rank(rank, world, port, queue, spec_data, steps):
    init_rank(rank, world, port)
    meter = Meter()
    meter.wrap_all_to_all()
    job = RankJob(spec_data, rank, world, loss_hook=meter.after_forward)
    out = {"walls": [], "peaks": [], "forward": [], "backward": [], "metered": [], "counts": [], "state": 0}
    for i in range(3 + steps):
        meter.reset()
        r = job.step()
        if i < 3:  # StepMemory's tracked steps (slower): not timed
            out["peaks"].append(r.peak_bytes)
        else:
            out["walls"].append(r.wall_s)
        out["forward"].append(meter.forward_bytes)
        out["backward"].append(meter.backward_bytes)
        out["metered"].append(meter.metered)
        out["counts"].append(torch.stack(meter.counts).tolist())  # [layers, experts]
        out["state"] = r.model_state_bytes
    # what this rank holds of the experts, to compare with the ranks that should hold the same shard
    from workers.parallel.expert_parallel import expert_parameters

    out["expert_sums"] = [float(getattr(p, "_local_tensor", p).detach().double().sum()) for p in
                          expert_parameters(job.model)]
    queue.put((rank, out))
    dist.destroy_process_group()


def imbalance(counts_by_rank: list[list[list[int]]], ep: int) -> tuple[float, float]:
    """(worst layer's max/mean assignments per expert over every rank's tokens,
        worst group and layer's max/mean assignments received per expert owner)."""
    c = torch.tensor(counts_by_rank, dtype=torch.float64)  # [ranks, layers, experts]
    total = c.sum(0)  # [layers, experts]
    per_expert = float((total.amax(-1) / total.mean(-1)).max())
    ranks, layers, experts = c.shape
    # ep groups are consecutive ranks (ParallelDims.mesh_dims: (dp_mod_ep, ep)); owner j holds experts
    # [j*E/ep, (j+1)*E/ep)
    groups = c.view(ranks // ep, ep, layers, experts).sum(1)  # [groups, layers, experts]
    owners = groups.view(ranks // ep, layers, ep, experts // ep).sum(-1)  # [groups, layers, owners]
    per_owner = float((owners.amax(-1) / owners.mean(-1)).max())
    return per_expert, per_owner


def measure(eps: list[int], workers: int, seq: int, global_batch: int, micro_batch: int, experts: int,
            top_k: int, steps: int) -> dict:
    results = {}
    for ep in eps:
        t0 = time.perf_counter()
        ranks = [out for _, out in spawn_ranks(_rank, workers, spec_for(ep, workers, seq, global_batch, micro_batch,
                                                                          experts, top_k), steps)]
        walls = [max(w) for w in zip(*(o["walls"] for o in ranks))]
        n = 3 + steps
        step_imbalance = [imbalance([o["counts"][i] for o in ranks], ep) for i in range(n)]
        results[ep] = {
            "walls": walls,
            "tokens_per_step": global_batch * seq,
            "peak": max(max(o["peaks"]) for o in ranks),
            "state": max(o["state"] for o in ranks),
            # per step, the largest rank's; the steps' largest
            "forward_bytes": max(max(o["forward"]) for o in ranks),
            "a2a_bytes": max(f + b for o in ranks for f, b in zip(o["forward"], o["backward"])),
            "metered_bytes": max(max(o["metered"]) for o in ranks),
            "a2a_matches_metered": all(f + b == m for o in ranks
                                       for f, b, m in zip(o["forward"], o["backward"], o["metered"])),
            "imbalance_steps": step_imbalance,
            "imbalance_expert_step1": step_imbalance[0][0],
            "imbalance_owner_step1": step_imbalance[0][1],
            # ranks r and r' hold the same expert shard when r % ep == r' % ep (a replica of it)
            "expert_replicas_agree": all(ranks[r]["expert_sums"] == ranks[r % ep]["expert_sums"]
                                         for r in range(workers)),
            "imbalance_expert": max(x[0] for x in step_imbalance),
            "imbalance_owner": max(x[1] for x in step_imbalance),
            "elapsed_s": time.perf_counter() - t0,
        }
    return results


def rows(results: dict) -> list[dict]:
    base = results[min(results)]
    base_tps = base["tokens_per_step"] / statistics.median(base["walls"])
    out = []
    for ep, r in results.items():
        tps = r["tokens_per_step"] / statistics.median(r["walls"])
        out.append({"ep": ep, "tokens_per_s": tps, "tokens_per_s_ratio": tps / base_tps,
                    "a2a_mib": r["a2a_bytes"] / MIB, "metered_mib": r["metered_bytes"] / MIB,
                    "a2a_matches_metered": r["a2a_matches_metered"],
                    "imbalance_expert": r["imbalance_expert"], "imbalance_owner": r["imbalance_owner"],
                    "imbalance_expert_step1": r["imbalance_expert_step1"],
                    "imbalance_owner_step1": r["imbalance_owner_step1"],
                    "expert_replicas_agree": r["expert_replicas_agree"],
                    "state_mib": r["state"] / MIB, "state_ratio": r["state"] / base["state"],
                    "peak_mib": r["peak"] / MIB, "peak_ratio": r["peak"] / base["peak"]})
    return out


HEAD = ("ep", "tokens/s", "tokens/s / ep1", "all-to-all MiB/step (fwd+bwd)", "metered MiB",
        "max/mean per expert (step 1 / worst)", "busiest ep rank / mean (step 1 / worst)",
        "model state MiB/rank", "state / ep1", "peak MiB/rank", "peak / ep1", "expert replicas agree")


def print_table(results: dict) -> None:
    body = [[str(r["ep"]), f"{r['tokens_per_s']:.0f}", f"{r['tokens_per_s_ratio']:.2f}", f"{r['a2a_mib']:.3f}",
             f"{r['metered_mib']:.3f}" + ("" if r["a2a_matches_metered"] else " (differs)"),
             f"{r['imbalance_expert_step1']:.2f} / {r['imbalance_expert']:.2f}",
             f"{r['imbalance_owner_step1']:.2f} / {r['imbalance_owner']:.2f}", f"{r['state_mib']:.2f}",
             f"{r['state_ratio']:.2f}", f"{r['peak_mib']:.1f}", f"{r['peak_ratio']:.2f}",
             "yes" if r["expert_replicas_agree"] else "NO"] for r in rows(results)]
    print_markdown_table(HEAD, body)
    print()
    if not all(r["expert_replicas_agree"] for r in rows(results)):
        print("NO: ranks that should hold the same experts hold different ones after the steps (their expert "
              "gradients were not reduced), so that row's later steps train diverged replicas; step 1's routing "
              "is still from the same weights everywhere.")
    print(HOST_CAVEAT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ep", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--experts", type=int, default=8)
    parser.add_argument("--top-k", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6, help="timed (untracked) steps after the 3 tracked ones")
    parser.add_argument("--json", type=Path, help="also write every measurement here")
    args = parser.parse_args()
    t0 = time.perf_counter()
    results = measure(args.ep, args.workers, args.seq, args.global_batch, args.micro_batch, args.experts,
                      args.top_k, args.steps)
    print(f"GPT d_model 64, 2 layers, 4 heads, model.moe experts {args.experts} top_k {args.top_k}; dp "
          f"{args.workers}; global batch {args.global_batch} x seq {args.seq}, micro-batch {args.micro_batch}; "
          f"{time.perf_counter() - t0:.0f} s")
    print_table(results)
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows(results),
                                         "results": results, "host_caveat": HOST_CAVEAT}, indent=2, default=str))


if __name__ == "__main__":
    main()
