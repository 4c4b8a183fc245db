"""Where Trainyard's FSDP gap to torchrun lies: the same job trained three ways, interleaved.

    .venv/bin/python bench/fsdp_gap.py [--reps 6] [--steps 40] [--layout fsdp]

  torchrun   the hand-written script of bench/hf_models.py (bench/torchrun_hf.py);
  trainer    Trainyard's own Trainer and strategy, one spawned process per rank, no Ray
             (workers/runtime/local_ranks.py, as the device check runs it);
  trainyard  `JobRun(spec).run()`, as `trainyard run` does: the same Trainer under Ray, in a child
             process of each rank actor (inside the actor with TRAINYARD_RANK_PROCESS=false in
             the environment this bench starts Ray from, as before 2026-12-04).

trainer / torchrun is what Trainyard's step code costs; trainyard / trainer is what running it
under Ray costs. Each rep runs the three in a rotated order; ratios are taken
within a rep. Steady samples/s as bench/hf_models.py (first 20% of steps skipped).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.ddp_runners import STEADY_SKIP, run_torchrun, run_trainyard, start_ray, steady_throughput  # noqa: E402
from bench.hf_models import WORKERS, make_spec  # noqa: E402
from bench.host_cpu import HostCpu  # noqa: E402
from bench.table import print_markdown_table  # noqa: E402

SIDES = ("torchrun", "trainer", "trainyard")


def run_trainer(spec, work: Path, tag: str) -> dict:
    """Trainyard's Trainer on WORKERS spawned processes (gloo), without Ray or the control plane."""
    from workers.runtime.local_ranks import run_jobs

    ranks = run_jobs([(tag, spec)], WORKERS, str(work), "cpu", timeout_s=900)[tag]
    failed = [r.get("error") for r in ranks if r.get("state") != "SUCCEEDED"]
    if failed:
        raise RuntimeError(f"trainer {tag}: {failed}")
    records = [r["records"] for r in ranks]
    step_ts = [max(r[i]["ts"] for r in records) for i in range(len(records[0]))]
    step_times = [max(r[i]["step_time_s"] for r in records) for i in range(len(records[0]))]
    return {**steady_throughput(step_ts, step_times, spec.train.global_batch_size),
            "steady_window": steady_window(step_ts)}


def steady_window(step_ts: list[float]) -> tuple[float, float]:
    """The wall-clock window steady_throughput measures over (its first 20% of steps skipped)."""
    return step_ts[max(1, int(len(step_ts) * STEADY_SKIP)) - 1], step_ts[-1]


def _absolute(result: dict) -> dict:
    """run_torchrun and run_trainyard give step times relative to their start; the sampler keeps wall time."""
    start = time.time() - result["total_s"]
    return {**result, "steady_window": steady_window([start + t for t in result["step_ts"]])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--layout", choices=("ddp", "fsdp"), default="fsdp")
    parser.add_argument("--num-cpus", type=int, default=8, help="logical CPUs of the local Ray")
    args = parser.parse_args()
    import ray

    spec = make_spec(args.layout, args.steps, 128, 8, 4)
    work = Path(tempfile.mkdtemp(prefix="trainyard-bench-gap-"))
    spec_file = work / "spec.json"
    spec_file.write_text(json.dumps(spec.model_dump(mode="json")))
    runners = {
        "torchrun": lambda tag: _absolute(run_torchrun(spec, spec_file, work, tag, "torchrun_hf.py",
                                                       ("--layout", args.layout))),
        "trainer": lambda tag: run_trainer(spec, work, tag),
        "trainyard": lambda tag: _absolute(run_trainyard(spec, work, tag)),
    }
    sps: dict[str, list[float]] = {side: [] for side in SIDES}
    cpu: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    host = HostCpu()
    try:
        start_ray(args.num_cpus)
        host.start()
        for rep in range(args.reps):
            order = SIDES[rep % 3:] + SIDES[:rep % 3]
            for side in order:
                result = runners[side](f"{side}-{rep}")
                sps[side].append(result["sps"])
                cpu[side].append(host.shares(*result["steady_window"]))
            print(f"rep {rep} ({' '.join(order)}): " + " | ".join(f"{s} {sps[s][-1]:.2f}" for s in SIDES)
                  + f" | trainer/torchrun {sps['trainer'][-1] / sps['torchrun'][-1]:.3f}"
                  + f" | trainyard/trainer {sps['trainyard'][-1] / sps['trainer'][-1]:.3f}", flush=True)
    finally:
        host.stop()
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)

    def ratio(a: str, b: str) -> str:
        r = [x / y for x, y in zip(sps[a], sps[b])]
        return f"{statistics.median(r):.3f} [{min(r):.3f}-{max(r):.3f}]"

    print_markdown_table(
        ("layout", *(f"{s} samples/s (median)" for s in SIDES), "trainer / torchrun", "trainyard / trainer",
         "trainyard / torchrun"),
        [(args.layout, *(f"{statistics.median(sps[s]):.2f}" for s in SIDES), ratio("trainer", "torchrun"),
          ratio("trainyard", "trainer"), ratio("trainyard", "torchrun"))])
    print("ratios within each rep: median [min-max]")
    kinds = sorted({k for side in SIDES for shares in cpu[side] for k in shares})
    print_markdown_table(("side", *kinds), [
        (side, *(f"{statistics.median(s.get(k, 0.0) for s in cpu[side]):.3f}" for k in kinds)) for side in SIDES])
    print("host CPU-seconds per second of each kind of process over each run's steady window (median over reps; "
          "bench/host_cpu.py)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
