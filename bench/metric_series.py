"""Prometheus series and scrape time of a fleet's live metrics: this tree against another.

    python -m bench.metric_series [--jobs 500] [--ranks 64] [--big 4096] [--finished 100] [--before 0e984f9]
                                  [--json OUT]

The fleet: `--jobs` running jobs of `--ranks` ranks each plus one job of `--big` ranks, and `--finished`
more that ran like them and ended within the retention window (`LiveMetrics.retain` has seen them
inactive; the database part counts the last 50 finished, as service/metrics.py does). Each side runs
in a subprocess of its own with its tree first on PYTHONPATH (`--before REV` is checked out with
`git worktree add` at `--before-tree`, default /tmp/metrics-before), on the REAL `LiveMetrics` of that
tree: every job's records go through `LiveMetrics.drained` as the reconciler hands them over (its
layout and spec, then `--drains` drains of `--steps-per-drain` step records each), in the joined
record shape of service/supervisor/aggregate.py (`_join`: a `ranks` list, one entry per rank, with the
straggler score the supervisor's StragglerWatch writes in, and a measured memory peak with its
breakdown, as a GPU worker reports every step). A few ranks per job are slow, and which ones changes
from drain to drain.

Then the registry is rendered (`prometheus_client.generate_latest`) `--scrapes` times: the series are
the sample lines of that text (every line that is not a comment, as Prometheus counts them), the render
time is the median (and the worst) of those renders' wall time, beside the median CPU time of the
rendering thread (what it costs where the host is not shared; the table says the host's load). A tree
that serves /metrics pre-rendered (service/metrics_exposition.py) is also scraped through it: `scrape s`
is what a scrape then waits (the render runs on the refresher's thread, every period); a tree without it
renders on the scrape, so its scrape is its render.
The `db` part of /metrics (service/metrics.py, from the database) is counted from that tree's own
`job_families` where it has one (7 series per open job, 3 per finished one), else from the earlier fixed
8 per job (open or among the last 50 finished), so `total` is what /metrics of this fleet carries. Both
sides run in the same invocation, one after the other, on the same host.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DB_SERIES_PER_JOB = 8  # before: step, total_steps, loss, samples/s, step time, restarts, active, state
DB_FLEET_SERIES = 7  # trainyard_jobs by state
RECENT_FINISHED = 50  # the finished jobs the database part lists
CATEGORIES = ("params", "grads", "optimizer", "activations")


def step_record(job_seed: int, step: int, world: int, slow: set[int], rng: random.Random) -> dict:
    """One joined step record as StepAggregator._join builds it, scored as StragglerWatch scores it."""
    ranks = []
    for r in range(world):
        compute = 0.100 * (2.5 if r in slow else 1.0) * (1 + 0.02 * rng.random())
        comm = 0.010 + 0.002 * rng.random()
        peak = 30e9 + 1e9 * rng.random()
        ranks.append({"rank": r, "compute_time_s": compute, "samples": 4, "comm_time_s": comm,
                      "step_time_s": compute + comm, "model_state_bytes": 16e9, "peak_memory_bytes": peak,
                      "peak_memory_breakdown": {"params": 4e9, "grads": 4e9, "optimizer": 8e9,
                                                "activations": peak - 16e9},
                      "peak_activation_bytes": peak - 16e9})
    step_time = max(r["step_time_s"] for r in ranks)
    median = statistics.median_low(r["compute_time_s"] for r in ranks)
    for r in ranks:
        r["straggler_score"] = median / r["compute_time_s"]
        r["step_time_s"] = step_time  # the ranks wait for the slowest in the collectives
    return {"type": "step", "seq": step, "step": step, "loss": 2.0, "step_time_s": step_time,
            "samples_per_s": 4 * world / step_time, "tokens_per_s": 4 * world * 2048 / step_time,
            "grad_norm": 1.0, "lr": 3e-4, "comm_bytes": 4e9, "model_state_bytes": 16e9,
            "peak_flops_per_s": None, "model_params": 1e9, "bubble_fraction": None, "skipped": False,
            "memory_tracked": True, "skip_reason": None, "bubble_fraction_theoretical": None,
            "ts": time.time(), "ranks": ranks, "peak_memory_bytes_per_rank": [r["peak_memory_bytes"] for r in ranks]}


def measure(args) -> dict:
    """One side: feed this tree's LiveMetrics, scrape it."""
    from prometheus_client import generate_latest

    import service
    from service.live_metrics import LiveMetrics

    live = LiveMetrics()
    jobs = [(f"job-{i:04d}", args.ranks) for i in range(args.jobs)] + [("job-big", args.big)]
    jobs += [(f"done-{i:04d}", args.ranks) for i in range(args.finished)]
    spec = {"supervisor": {"straggler": {"policy": "report", "threshold": 0.6}}}
    rng = random.Random(0)
    feed_s: list[float] = []
    big_drain_s: list[float] = []
    step = 0
    for drain in range(args.drains):
        for seed, (job, world) in enumerate(jobs):
            slow = set(rng.sample(range(world), min(world, 3 + drain)))  # a different few each drain
            records = [step_record(seed, step + k, world, slow, rng) for k in range(args.steps_per_drain)]
            t0 = time.perf_counter()
            live.drained(job, records, layout={"world_size": world, "dp": world, "tp": 1, "pp": 1}, spec=spec)
            took = time.perf_counter() - t0
            feed_s.append(took)
            if job == "job-big":
                big_drain_s.append(took)
        step += args.steps_per_drain
    running = {job for job, _ in jobs if not job.startswith("done-")}
    live.retain(running, now=0.0)  # the finished ones ended a moment ago: within the retention
    live.retain(running, now=1.0)
    scrapes, cpu, text = [], [], b""
    for _ in range(args.scrapes):
        t0, c0 = time.perf_counter(), time.thread_time()
        text = generate_latest(live.registry)
        scrapes.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
    served = []
    # by file: the venv's editable install would find this tree's module for an earlier tree's package
    if not (Path(service.__file__).parent / "metrics_exposition.py").exists():  # renders on every scrape
        served = scrapes
    else:
        from service.metrics_exposition import PrerenderedExposition

        exposition = PrerenderedExposition(live.registry)
        exposition.latest()  # the first scrape renders; then the refresher does, every period
        for _ in range(args.scrapes):
            t0 = time.perf_counter()
            exposition.latest()
            served.append(time.perf_counter() - t0)
    lines = [ln for ln in text.decode().splitlines() if ln and not ln.startswith("#")]
    rank_series = sum(1 for ln in lines if 'rank="' in ln)

    def of(job: str) -> int:
        return sum(1 for ln in lines if f'job="{job}"' in ln)

    live_series = len(lines)
    db_series = DB_FLEET_SERIES + database_series(len(running), args.finished)
    return {"tree": str(Path(service.__file__).resolve().parent.parent), "jobs": len(jobs),
            "ranks": args.ranks, "big_ranks": args.big, "live_series": live_series, "db_series": db_series,
            "total_series": live_series + db_series, "rank_labelled_series": rank_series,
            "series_per_job": of("job-0000") + database_series(1, 0),
            "series_big_job": of("job-big") + database_series(1, 0),
            "series_finished_job": of("done-0000") + database_series(0, 1),
            "scrape_served_s_median": statistics.median(served),
            "scrape_s_median": statistics.median(scrapes), "scrape_s_max": max(scrapes),
            "scrape_cpu_s_median": statistics.median(cpu), "load_1m": os.getloadavg()[0],
            "scrape_mib": len(text) / 2**20, "drained_ms_mean": 1e3 * statistics.fmean(feed_s),
            "drained_ms_big_job": 1e3 * statistics.median(big_drain_s)}


def database_series(running: int, finished: int) -> int:
    """The database part's series of this tree for `running` open and `finished` finished jobs."""
    try:
        from service.metrics import job_families
    except ImportError:  # an earlier tree: 8 per open job and per listed finished one
        return DB_SERIES_PER_JOB * (running + min(finished, RECENT_FINISHED))
    from types import SimpleNamespace

    def row(i: int, state: str):
        return SimpleNamespace(id=f"j{i}", name="n", state=state, step=10, total_steps=100, loss=2.0,
                               samples_per_s=50.0, restarts=0, summary=None)

    families = job_families([row(i, "RUNNING") for i in range(running)],
                            [row(i, "SUCCEEDED") for i in range(min(finished, RECENT_FINISHED))])
    return sum(len(f.samples) for f in families)


def side(tree: Path, args) -> dict:
    out = Path(tempfile.mkstemp(suffix=".json")[1])
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--jobs", str(args.jobs), "--ranks",
           str(args.ranks), "--big", str(args.big), "--finished", str(args.finished), "--drains", str(args.drains),
           "--steps-per-drain",
           str(args.steps_per_drain), "--scrapes", str(args.scrapes), "--json", str(out)]
    subprocess.run(cmd, env=env, cwd=tree, check=True)
    result = json.loads(out.read_text())
    out.unlink()
    assert Path(result["tree"]) == tree.resolve(), f"measured {result['tree']}, not {tree}"
    return result



def _tree_at(rev: str, path: Path) -> Path:
    from bench.trees import tree_at  # here, not at the top: the child runs this file inside the earlier tree

    return tree_at(rev, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--big", type=int, default=4096, help="ranks of the one large job")
    parser.add_argument("--finished", type=int, default=100, help="jobs that ended within the retention")
    parser.add_argument("--drains", type=int, default=3)
    parser.add_argument("--steps-per-drain", type=int, default=2)
    parser.add_argument("--scrapes", type=int, default=5)
    parser.add_argument("--before", default="0e984f9", help="the revision to compare with ('' = none)")
    parser.add_argument("--before-tree", default="/tmp/metrics-before", help="its worktree (made if missing)")
    parser.add_argument("--json", default=None, help="write the figures as JSON to this file ('-': stdout)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        assert args.json is not None
        Path(args.json).write_text(json.dumps(measure(args)))
        return
    results = {}
    if args.before:
        results[f"before ({args.before})"] = side(_tree_at(args.before, Path(args.before_tree)), args)
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    results[f"after ({head}, working tree)"] = side(REPO, args)
    from bench.table import print_markdown_table

    print(f"fleet: {args.jobs} jobs x {args.ranks} ranks + 1 job x {args.big} ranks running, {args.finished} "
          "finished within the retention; "
          f"{args.drains} drains x {args.steps_per_drain} steps per job; host: {os.cpu_count()} cores, 1-minute load "
          + ", ".join(f"{r['load_1m']:.1f}" for r in results.values()))
    rows = [(name, f"{r['live_series']:,}", f"{r['db_series']:,}", f"{r['total_series']:,}",
             f"{r['rank_labelled_series']:,}", str(r["series_per_job"]), f"{r['series_big_job']:,}",
             str(r["series_finished_job"]), f"{r['scrape_s_median']:.3f}", f"{r['scrape_s_max']:.3f}",
             f"{r['scrape_cpu_s_median']:.3f}", f"{r['scrape_served_s_median']:.4f}", f"{r['scrape_mib']:.1f}",
             f"{r['drained_ms_big_job']:.1f}")
            for name, r in results.items()]
    print_markdown_table(("tree", "live series", "db series", "total series", "rank-labelled",
                          f"series / {args.ranks}-rank job", f"series / {args.big}-rank job", "series / finished job",
                          "render s (median)", "render s (max)", "render CPU s", "scrape s (median)", "MiB",
                          f"drained ms ({args.big}-rank job)"), rows)
    if args.json is not None:
        text = json.dumps({"fleet": {"jobs": args.jobs, "ranks": args.ranks, "big": args.big,
                                     "finished": args.finished, "drains": args.drains,
                                     "steps_per_drain": args.steps_per_drain, "scrapes": args.scrapes},
                           "results": results}, indent=2) + "\n"
        if args.json == "-":
            print(text, end="")
        else:
            Path(args.json).write_text(text)


if __name__ == "__main__":
    main()

