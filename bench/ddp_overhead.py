"""DDP overhead of Trainyard against a plain torchrun script and Ray Train's TorchTrainer.

Run from the repository root (about 4-5 minutes on a 2-core machine with the defaults):

    .venv/bin/python bench/ddp_overhead.py [--steps 60] [--rounds 3] [--raytrain-runs 2]
        [--no-warm-pool] [--no-raytrain] [--no-profile] [--quiet-wait 20] [--json OUT.json]

One GPT (2 layers, d_model 128, 4 heads, seq_len 64), the byte-level stdlib text,
global batch 32 in micro-batches of 8, dp=2 on CPU with one thread per rank, trained by
  A. Trainyard: `JobRun(spec, ...).run()` on a local Ray (num_cpus=8) that this
     process starts once, before any measurement, and keeps running. "cold": no
     warm worker pool in the cluster; "warm pool": `workers.runtime.pool.start_pool` has
     filled a pool first (only where the tree has workers/runtime/pool.py);
  B. torchrun: `torchrun --nproc-per-node 2 bench/torchrun_ddp.py` (a hand-written
     DDP loop over the project's model/data/loss/LR modules: the same math, so the
     final losses printed below agree);
  C. Ray Train: `TorchTrainer(ScalingConfig(num_workers=2))` running the same loop,
     on the same running Ray.
A and B are interleaved (A B A B ...; cold rounds, then warm-pool rounds). The machine is
shared, so before each run the bench waits (up to --quiet-wait s) for the CPUs to go idle,
and during each run it samples the number of runnable tasks; a run that started busy or
ran beside others' work (more runnable tasks than its own) is marked "disturbed" and left
out of the medians whenever an undisturbed run of that system exists.
Reported per system:
  - samples/s: steady state from wall-clock step-finish times (the first 20% of steps
    skipped, as Trainyard's summary does): G x steps / elapsed; median over rounds;
  - time to first step: A from calling JobRun.run() to the first on_step record,
    B from launching torchrun to the first finished step (slowest rank),
    C from calling fit() to the first finished step; ray.init is reported apart.
Then profiled Trainyard runs break A's time to first step into phases
(bench/trainyard_startup_profile.py). This is a benchmark that prints a table, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.ddp_runners import (  # noqa: E402
    make_spec,
    run_raytrain,
    run_torchrun,
    run_trainyard,
    start_ray,
    start_warm_pool,
    stop_warm_pool,
    wait_pool_full,
)
from bench.table import print_markdown_table  # noqa: E402
from bench.trainyard_startup_profile import format_profile, profile_startup  # noqa: E402

# --- is anyone else using the CPUs? -----------------------------------------


def cpu_busy_fraction(window_s: float = 0.5) -> float:
    """Fraction of all CPUs busy over a short window (/proc/stat)."""
    def sample():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]  # total, idle + iowait
    t1, i1 = sample()
    time.sleep(window_s)
    t2, i2 = sample()
    return 1.0 - (i2 - i1) / max(1, t2 - t1)


def wait_for_quiet(max_wait_s: float, busy_below: float = 0.25) -> tuple[float, float]:
    """Wait until the machine is mostly idle; return (seconds waited, last busy fraction)."""
    t0 = time.time()
    busy = cpu_busy_fraction()
    while busy >= busy_below and time.time() - t0 < max_wait_s:
        busy = cpu_busy_fraction()
    return time.time() - t0, busy


class RunnableSampler:
    """Mean number of runnable tasks on the machine (/proc/loadavg) while a run goes on.

    A 2-rank run alone shows about 2-3 (its ranks, now and then its driver, this sampler);
    clearly more means someone else's work shared the CPUs with it.
    """

    def __init__(self, interval_s: float = 0.1):
        self.interval_s, self.samples = interval_s, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            with open("/proc/loadavg") as f:
                self.samples.append(int(f.read().split()[3].split("/")[0]) - 1)  # minus this sampler

    def __enter__(self) -> "RunnableSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def mean(self) -> float:
        return statistics.fmean(self.samples) if self.samples else 0.0


# --- summarising ------------------------------------------------------------


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def clean(runs: list[dict]) -> list[dict]:
    """The undisturbed runs, or all of them if every run was disturbed."""
    ok = [r for r in runs if not r["disturbed"]]
    return ok or runs


def median(runs: list[dict], key: str) -> float | None:
    vals = [r[key] for r in clean(runs) if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def print_table(rows: list[tuple[str, list[dict]]]) -> None:
    base = dict(rows)
    torchrun_sps = median(base["torchrun (plain DDP script)"], "sps")
    raytrain = base.get("Ray Train TorchTrainer (fit)")
    raytrain_ttfs = median(raytrain, "ttfs") if raytrain else None
    head = ("system", "samples/s (median of rounds)", "ratio vs torchrun", "time to first step (s)",
            "ratio vs Ray Train", "runs used")
    body = []
    for name, runs in rows:
        sps, ttfs = median(runs, "sps"), median(runs, "ttfs")
        body.append((name, _fmt(sps), _fmt(sps / torchrun_sps if sps and torchrun_sps else None, ".3f"),
                     _fmt(ttfs, ".2f"), _fmt(ttfs / raytrain_ttfs if ttfs and raytrain_ttfs else None, ".3f"),
                     f"{len(clean(runs))}/{len(runs)}"))
    print_markdown_table(head, body)


def print_details(res: dict, rows: list[tuple[str, list[dict]]]) -> None:
    print("per run: samples/s wall | G/median step | slowest steady step ms | first step s | runnable tasks (mean)"
          " | * = disturbed")
    for name, runs in rows:
        print(f"  {name}: " + ", ".join(
            f"{_fmt(r['sps'], '.0f')}|{_fmt(r['sps_median_step'], '.0f')}|{_fmt(r['slowest_step_s'] and 1000 * r['slowest_step_s'], '.0f')}"
            f"|{r['ttfs']:.2f}|{r['runnable']:.1f}"
            + ("*" if r["disturbed"] else "") for r in runs))
    tr = median(res["torchrun"], "sps_median_step")
    for key, name in (("cold", "Trainyard cold"), ("warm", "Trainyard warm pool")):
        if res[key]:
            paired = [r["ratio_to_adjacent_torchrun"] for r in clean(res[key])]
            print(f"{name} vs torchrun: median of same-round ratios {statistics.median(paired):.3f}; "
                  f"by G/median step time {median(res[key], 'sps_median_step') / tr:.3f}")
    print("final loss (same math => equal): " + "; ".join(
        f"{name} " + " ".join(f"{r['final_loss']:.4f}" for r in runs) for name, runs in rows))
    if res["raytrain"]:
        r = res["raytrain"][0]
        print(f"Ray Train after fit() (first run): train loop entered on the workers at "
              f"{r['phases'].get('loop_entered', float('nan')):.2f} s, first step at {r['ttfs']:.2f} s")
    print("torchrun after launch (last run): " + ", ".join(f"{k} {v:.2f}" for k, v in res["torchrun"][-1]["phases"].items()))


# --- the benchmark ----------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description="Trainyard vs torchrun vs Ray Train: DDP throughput and time to first step")
    parser.add_argument("--steps", type=int, default=60, help="training steps per run")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (A B) per Trainyard variant")
    parser.add_argument("--raytrain-runs", type=int, default=2, help="runs of Ray Train's TorchTrainer")
    parser.add_argument("--no-warm-pool", action="store_true", help="skip the warm-pool rounds even if the tree has a pool")
    parser.add_argument("--no-raytrain", action="store_true", help="skip Ray Train's TorchTrainer")
    parser.add_argument("--no-profile", action="store_true", help="skip the profiled Trainyard start-up runs")
    parser.add_argument("--num-cpus", type=int, default=8, help="logical CPUs of the local Ray")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds to let a fresh Ray go idle first")
    parser.add_argument("--quiet-wait", type=float, default=20.0, help="max seconds to wait for idle CPUs before each run")
    parser.add_argument("--max-runnable", type=float, default=3.5,
                        help="mean runnable tasks above which a run counts as disturbed")
    parser.add_argument("--json", type=Path, help="also write every measurement here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs, rank files)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=FutureWarning)

    import ray

    spec = make_spec(args.steps)
    work = Path(tempfile.mkdtemp(prefix="trainyard-bench-"))
    spec_file = work / "spec.json"
    spec_file.write_text(json.dumps(spec.model_dump(mode="json")))
    res: dict = {"steps": args.steps, "rounds": args.rounds, "cold": [], "warm": [], "torchrun": [], "raytrain": [],
                 "loadavg_before": os.getloadavg(), "notes": []}
    t_bench = time.time()

    def measured(fn, *fargs) -> dict:
        waited, busy = wait_for_quiet(args.quiet_wait)
        with RunnableSampler() as sampler:
            r = fn(*fargs)
        r.update(quiet_wait_s=waited, busy_before=busy, runnable=sampler.mean,
                 disturbed=busy >= 0.25 or sampler.mean > args.max_runnable)
        return r

    def interleave(label: str, key: str, pool=None) -> None:
        for i in range(args.rounds):
            if pool is not None:
                wait_pool_full(pool, spec.world_size)  # the pool refills a few seconds after each take
            a = measured(run_trainyard, spec, work, f"{key}-{i}")
            res[key].append(a)
            b = measured(run_torchrun, spec, spec_file, work, f"torchrun-{key}-{i}")
            res["torchrun"].append(b)
            a["ratio_to_adjacent_torchrun"] = a["sps"] / b["sps"]
            print(f"{label} round {i}: Trainyard {a['sps']:.1f} samples/s, first step {a['ttfs']:.2f} s, "
                  f"runnable {a['runnable']:.1f} | torchrun {b['sps']:.1f} samples/s, first step {b['ttfs']:.2f} s, "
                  f"runnable {b['runnable']:.1f}", flush=True)

    try:
        res["ray_init_s"] = start_ray(args.num_cpus)
        print(f"ray.init: {res['ray_init_s']:.2f} s; settling {args.settle:.0f} s", flush=True)
        time.sleep(args.settle)
        interleave("cold", "cold")
        if not args.no_profile:
            wait_for_quiet(args.quiet_wait)
            res["profile_cold"] = profile_startup(make_spec(5, "bench-profile"), work / "profile-cold", "profile-cold")
        pool = None if args.no_warm_pool else start_warm_pool(spec.world_size)
        if pool is None and not args.no_warm_pool:
            res["notes"].append("no warm pool in this tree (workers/runtime/pool.py): warm-pool rows skipped")
        if pool is not None:
            try:
                interleave("warm pool", "warm", pool)
                if not args.no_profile:
                    wait_pool_full(pool, spec.world_size)
                    wait_for_quiet(args.quiet_wait)
                    res["profile_warm"] = profile_startup(make_spec(5, "bench-profile"), work / "profile-warm", "profile-warm")
            finally:
                stop_warm_pool(pool)
        for i in range(0 if args.no_raytrain else args.raytrain_runs):
            c = measured(run_raytrain, spec, work, f"raytrain-{i}")
            res["raytrain"].append(c)
            print(f"Ray Train run {i}: {_fmt(c['sps'])} samples/s, first step {c['ttfs']:.2f} s after fit(), "
                  f"runnable {c['runnable']:.1f}", flush=True)
    finally:
        ray.shutdown()
        res["loadavg_after"] = os.getloadavg()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    rows = [("Trainyard cold (JobRun, running Ray)", res["cold"])]
    if res["warm"]:
        rows.append(("Trainyard warm pool (JobRun)", res["warm"]))
    rows.append(("torchrun (plain DDP script)", res["torchrun"]))
    if res["raytrain"]:
        rows.append(("Ray Train TorchTrainer (fit)", res["raytrain"]))
    print()
    print(f"DDP overhead: GPT 2x128, seq 64, global batch 32 (micro 8), dp=2 on CPU, {args.steps} steps, "
          f"{args.rounds} interleaved rounds per Trainyard variant; load average before "
          f"{res['loadavg_before'][0]:.2f}, after {res['loadavg_after'][0]:.2f}")
    print_table(rows)
    print(f"ray.init (local Ray, num_cpus={args.num_cpus}), paid once before all of the above: {res['ray_init_s']:.2f} s")
    print("targets: Trainyard samples/s >= 0.95 x torchrun; Trainyard time to first step < 0.1 x Ray Train's")
    print_details(res, rows)
    for note in res["notes"]:
        print("note:", note)
    for key, title in (("profile_cold", "Trainyard cold time-to-first-step breakdown"),
                       ("profile_warm", "Trainyard warm-pool time-to-first-step breakdown")):
        if key in res:
            print()
            print(format_profile(res[key], title))
    print(f"\nbench wall time {time.time() - t_bench:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(res, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
