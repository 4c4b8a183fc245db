"""Pipeline schedules side by side: samples/s, measured vs theoretical bubble, peak activations in flight.

Run from the repository root (a few minutes on a 2-core machine with the defaults):

    .venv/bin/python bench/pipeline.py [--pp 2] [--microbatches 2,4,8] [--schedules gpipe,1f1b,...]
        [--steps 12] [--d-model 128] [--n-layers 4] [--seq-len 64] [--micro-batch-size 4] [--json OUT]

A second table splits each schedule's step into forward, backward (the input-gradient half where the
schedule splits it), weight-gradient, p2p, idle and the rest (the schedule runtime's own work), against
the first schedule listed: where a schedule's time goes, e.g. zero-bubble's beside 1F1B's.

Stash MiB and stale are pipedream's and pipedream_2bw's weight copies (the busiest rank's) and the stalest
gradient they applied; loss is the final one, to compare convergence on the same steps.

Each row is one `JobRun` on a local Ray with dp=1 and the global batch equal to
one pipeline flush (microbatches x micro_batch_size), so the bubble is the
schedule's. The baseline is a plain data-parallel run of the same model and
global batch on the same number of workers (dp=pp); `vs dp` is the pipeline's
samples/s over it. Measured numbers are steady-state means (first 20% of steps
skipped); peak activation bytes are the largest over stages.
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
from workers.spec import PIPELINE_SCHEDULES, SINGLE_STAGE_SCHEDULES  # noqa: E402
from workers.spec_loading import parse_spec


def spec_for(args, pp: int, schedule: str | None, m: int, split=None):
    spec = {
        "name": f"bench-{schedule or 'dp'}-{m}",
        "model": {"name": "gpt", "n_layers": args.n_layers, "d_model": args.d_model, "n_heads": 4,
                  "seq_len": args.seq_len},
        "data": {"name": "text:pystdlib", "max_bytes": 400_000},
        "train": {"steps": args.steps, "global_batch_size": m * args.micro_batch_size,
                  "micro_batch_size": args.micro_batch_size, "lr": 1e-3, "lr_schedule": "constant"},
        "resources": {"workers": pp},
        "parallel": {"pp": pp} if schedule else {},
    }
    if schedule:
        v = 1 if schedule in SINGLE_STAGE_SCHEDULES else 2
        spec["parallel"]["pipeline"] = {"schedule": schedule, "microbatches": m, "virtual_stages": v,
                                        **({"split": split} if split else {})}
    return parse_spec(spec)


# Where a step's time goes on a rank (stage_meter.py): compute split as the schedule runs it, p2p calls'
# own cost, waiting for the neighbour, and the rest of the step (the schedule runtime's own Python).
TIME_PARTS = ("forward", "backward", "weight_grad", "comm", "idle", "other", "wall")


def print_time_parts(rows: list[dict]) -> None:
    """ms per step, mean over ranks, and each part's change against the first schedule of the same M."""
    print("\nwhere a step's time goes (ms per step, mean over ranks; x: the first schedule's same part)")
    print(f"{'schedule':>17} {'M':>2} " + " ".join(f"{p:>14}" for p in TIME_PARTS))
    first: dict[int, dict] = {}
    for r in rows:
        if not r["time_ms"]:
            continue
        ref = first.setdefault(r["microbatches"], r["time_ms"])
        cells = [f"{r['time_ms'][p]:7.1f} x{r['time_ms'][p] / ref[p]:5.2f}" if ref[p] > 0
                 else f"{r['time_ms'][p]:7.1f} {'':6}" for p in TIME_PARTS]
        print(f"{r['schedule']:>17} {r['microbatches']:>2} " + " ".join(f"{c:>14}" for c in cells))


def valid(args, schedule: str, m: int) -> str | None:
    try:
        spec_for(args, args.pp, schedule, m)
    except ValueError as exc:
        return str(exc).splitlines()[1].strip() if "\n" in str(exc) else str(exc)
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--microbatches", default="2,4,8")
    ap.add_argument("--schedules", default=",".join(PIPELINE_SCHEDULES))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--n-layers", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--micro-batch-size", type=int, default=4)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    home = Path(tempfile.mkdtemp(prefix="trainyard-bench-pp-"))
    connect(Settings(home=home / "home"))
    rows = []
    for m in [int(x) for x in args.microbatches.split(",")]:
        base = JobRun(spec_for(args, args.pp, None, m), home / f"dp-{m}", f"dp-{m}").run()
        for schedule in args.schedules.split(","):
            why = valid(args, schedule, m)
            if why:
                print(f"skip {schedule} M={m}: {why}", flush=True)
                continue
            name = f"{schedule}-{m}"
            s = JobRun(spec_for(args, args.pp, schedule, m), home / name, name).run()
            pipe = s["pipeline"] or {}
            stages = pipe.get("stages", [])
            rows.append({
                "schedule": schedule, "pp": args.pp, "microbatches": m, "state": s["state"],
                "samples_per_s": s["samples_per_s"], "dp_samples_per_s": base["samples_per_s"],
                "vs_dp": s["samples_per_s"] / base["samples_per_s"] if s["samples_per_s"] else None,
                "bubble": s["bubble_fraction"], "bubble_theory": s["bubble_fraction_theoretical"],
                "stage_bubbles": [round(st["bubble_fraction"], 3) for st in stages],
                "act_peak_bytes": max((st["activation_bytes_peak"] for st in stages), default=None),
                "act_peak_microbatches": [st["activation_microbatches_peak"] for st in stages],
                "final_loss": s["final_loss"],
                "staleness": (s.get("pipeline_async") or {}).get("max_staleness"),
                "stashed_weight_bytes": (s.get("pipeline_async") or {}).get("stashed_weight_bytes"),
                "time_ms": {part: 1000 * sum(st[f"{part}_s"] for st in stages) / len(stages)
                            for part in TIME_PARTS} if stages else None,
            })
            r = rows[-1]
            print(f"{schedule:>17} P={args.pp} M={m:<2} {r['samples_per_s']:8.1f} samples/s  vs dp {r['vs_dp']:.2f}  "
                  f"bubble {r['bubble']:.3f} (theory {r['bubble_theory']:.3f}) stages {r['stage_bubbles']}  "
                  f"act peak {r['act_peak_bytes'] / 2**20:.2f} MiB {r['act_peak_microbatches']}", flush=True)
    print()
    print(f"{'schedule':>17} {'P':>2} {'M':>2} {'samples/s':>10} {'vs dp':>6} {'bubble':>7} {'theory':>7} "
          f"{'act MiB':>8} {'stash MiB':>9} {'stale':>5} {'loss':>7}")
    for r in rows:
        stash = f"{r['stashed_weight_bytes'] / 2**20:9.2f}" if r["stashed_weight_bytes"] else f"{'-':>9}"
        stale = f"{r['staleness']:5.2f}" if r["staleness"] is not None else f"{'-':>5}"
        print(f"{r['schedule']:>17} {r['pp']:>2} {r['microbatches']:>2} {r['samples_per_s']:>10.1f} {r['vs_dp']:>6.2f} "
              f"{r['bubble']:>7.3f} {r['bubble_theory']:>7.3f} {r['act_peak_bytes'] / 2**20:>8.2f} {stash} {stale} "
              f"{r['final_loss']:>7.4f}")
    print_time_parts(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    import ray
    ray.shutdown()


if __name__ == "__main__":
    main()
