"""parallel.collectives flat against hierarchical on the share-nothing bed with shaped links (issue 50).

Two worker hosts of 2 CPUs each (the head holds no rank) make 2 nodes x 2 ranks of one DDP job; every
host's egress is shaped with tc: a token bucket (tbf) at 1 Gbit/s by default, and with --delay netem adds a
one-way delay (0.5 ms in the issue; this host's kernel has no sch_netem, so the table below has none).
The same spec trains three times on the same bed, one after the other:

- flat: one ring all-reduce over the 4 ranks (DDP's plain hook);
- hierarchical: reduce-scatter in the node, all-reduce across nodes, all-gather in the node;
- hierarchical + fp16: the same with the cross-node all-reduce in fp16 (only what crosses hosts).

Columns: steady-state step time (JobRun's summary: global batch / samples/s), bytes crossing hosts per
step as the hook counts them from the node map (`cross_node_bytes_per_step`, the job's ranks together),
bytes the worker hosts' NICs really sent during the whole job per step (veth counters: the gradients
plus the parameter broadcast, Ray's control traffic and the driver's polls), final loss, and each
one's ratio to flat from this same run.

    sudo .venv/bin/python -m bench.hierarchical [--steps 20] [--d-model 384] [--rate 1gbit] [--delay 0.5ms]

Needs root (network namespaces, tc). The model is the smallest built-in GPT whose gradient makes the
all-reduce matter at 1 Gbit/s on a shared 2-core host (d_model 384, 2 blocks: 3.6 M parameters, 14 MB
of fp32 gradient): larger models spend the whole step computing on the shared cores.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.table import print_markdown_table  # noqa: E402

RUNS = {
    "flat": {"collectives": "flat"},
    "hierarchical": {"collectives": "hierarchical"},
    "hierarchical + fp16 across nodes": {"collectives": "hierarchical", "compression": {"kind": "fp16"}},
}
WORKERS = ["w1", "w2"]


def spec_for(parallel: dict, steps: int, d_model: int):
    from workers.spec_loading import parse_spec

    return parse_spec({
        "name": "bench-hier",
        "model": {"name": "gpt", "n_layers": 2, "d_model": d_model, "n_heads": 4, "seq_len": 32},
        "data": {"name": "text:pystdlib", "max_bytes": 200_000},
        "train": {"steps": steps, "global_batch_size": 8, "micro_batch_size": 2, "lr": 1e-3, "warmup_steps": 2,
                  "seed": 0},
        "parallel": {"dp": 4, **parallel},
        "resources": {"workers": 4, "cpus_per_worker": 1},
        "checkpoint": {"every_steps": 0},
    })


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--d-model", type=int, default=384)
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--delay", default=None, help="added one-way delay (tc netem; this host's kernel has none)")
    args = parser.parse_args()

    from tests.sharenothing.cluster import ShareNothingCluster
    from tests.sharenothing.shaping import qdiscs, shaped, train_on_bed

    work = Path(tempfile.mkdtemp(prefix="bench-hier-"))
    specs = {name: spec_for(p, args.steps, args.d_model) for name, p in RUNS.items()}
    bed = ShareNothingCluster(work / "bed", workers=2, num_cpus=2, head_cpus=0).start()
    try:
        with shaped(bed, WORKERS, args.rate, args.delay):
            print(f"shaped: {qdiscs(bed, 'w1').strip()}", file=sys.stderr)
            results = train_on_bed(bed, specs, WORKERS)
    finally:
        bed.stop()

    def of(name: str) -> tuple[float, float, float, float]:
        r = results[name]
        s = r["summary"]
        assert s["state"] == "SUCCEEDED", (name, s.get("error"))
        step = s["samples_per_s"] and 8 / s["samples_per_s"]
        return step, s["cross_node_bytes_per_step"] or 0.0, r["crossed_bytes"] / s["steps"], s["final_loss"]

    base = of("flat")
    body = []
    for name in RUNS:
        step, counted, measured, loss = of(name)
        body.append((name, f"{step * 1e3:.0f}", f"{step / base[0]:.2f}", f"{counted / 1e6:.2f}",
                     f"{counted / base[1]:.2f}" if base[1] else "-", f"{measured / 1e6:.2f}",
                     f"{measured / base[2]:.2f}", f"{loss:.6f}"))
    link = f"{args.rate} + {args.delay} (tc netem)" if args.delay else f"{args.rate} (tc tbf, no added delay)"
    print(f"2 hosts x 2 ranks (gloo, CPU), links {link}, GPT d_model "
          f"{args.d_model} x 2 blocks, {args.steps} steps, global batch 8")
    print_markdown_table(("collectives", "step ms", "x flat", "counted MB/step across hosts", "x flat",
                          "NIC MB/step (whole job)", "x flat", "final loss"), body)


if __name__ == "__main__":
    main()
