"""What a supervisor spends per step at 64 to 4,096 ranks: joining the ranks' records, scoring
stragglers, keeping the step, and the rebalance split; this tree against an earlier one, in one run.

    .venv/bin/python bench/supervisor_scale.py [--before-tree /tmp/fleet-before] [--json OUT]

Each figure is the median over steps of one process's wall time (the host's other load moves it
a little; the ratios between trees are what the issue's targets are about: join + score <= 10 ms
a step at 4,096 ranks, nothing quadratic).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RANKS = (64, 1024, 4096)
STEPS = 30


def measure() -> dict:
    sys.path.insert(0, os.getcwd())
    from service.supervisor.aggregate import StepAggregator
    from service.supervisor.policies.stragglers.rebalance import rebalanced_shares
    from service.supervisor.run import JobRun
    from service.supervisor.stragglers import StragglerWatch
    from workers.spec import StragglerSpec

    class Listener:
        def on_step(self, record: dict) -> None:
            pass

        def on_event(self, event) -> None:
            pass

    out = {}
    rng = random.Random(0)
    for ranks in RANKS:
        agg, watch = StepAggregator(ranks, 4 * ranks), StragglerWatch(ranks, StragglerSpec())
        run = JobRun.__new__(JobRun)  # only what _append_step reads: the run's history and its listener
        history = getattr(sys.modules["service.supervisor.run"], "StepHistory", list)  # the earlier tree: a list
        run.steps, run.listener = history(), Listener()
        join, score, keep = [], [], []
        for step in range(1, STEPS + 1):
            records = [{"step": step, "rank": r, "loss": 1.0, "step_time_s": 1.0,
                        "compute_time_s": rng.uniform(0.7, 0.8),
                        "comm_time_s": 0.2, "samples": 4, "tokens": 256, "grad_norm": 1.0, "lr": 1e-3,
                        "comm_bytes": 1 << 20, "model_state_bytes": 1 << 26, "stage": None, "skipped": False,
                        "peak_memory_bytes": None, "ts": float(step)} for r in range(ranks)]
            t0 = time.perf_counter()
            for rec in records:
                joined = agg.add(rec)
            t1 = time.perf_counter()
            watch.observe(joined)
            t2 = time.perf_counter()
            run._append_step(joined)
            t3 = time.perf_counter()
            join.append(t1 - t0)
            score.append(t2 - t1)
            keep.append(t3 - t2)
        t0 = time.perf_counter()
        rebalanced_shares(8 * ranks, [rng.uniform(0.5, 2.0) for _ in range(ranks)])
        out[ranks] = {"join_ms": 1000 * statistics.median(join), "score_ms": 1000 * statistics.median(score),
                      "keep_ms": 1000 * statistics.median(keep), "rebalance_ms": 1000 * (time.perf_counter() - t0)}
    return out


def in_tree(tree: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "supervisor_scale.py"), "--measure"], cwd=tree,
                          env=env, capture_output=True, text=True, check=True)
    return {int(k): v for k, v in json.loads(proc.stdout.splitlines()[-1]).items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before-tree", type=Path, help="a checkout of the earlier code (git worktree add)")
    p.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    if a.measure:
        print(json.dumps(measure()))
        return
    trees = {"this tree": ROOT} | ({"before": a.before_tree} if a.before_tree else {})
    results = {name: in_tree(tree) for name, tree in trees.items()}
    print(f"{'ranks':>6} {'tree':>10} {'join ms':>9} {'score ms':>9} {'keep ms':>9} {'rebalance ms':>13}")
    for ranks in RANKS:
        for name, res in results.items():
            r = res[ranks]
            print(f"{ranks:>6} {name:>10} {r['join_ms']:9.2f} {r['score_ms']:9.2f} {r['keep_ms']:9.2f} "
                  f"{r['rebalance_ms']:13.2f}")
    if a.json:
        a.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
