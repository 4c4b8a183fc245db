"""What an idle rank actor's Ray core worker costs in CPU, and which of Ray's knobs change it.

    .venv/bin/python bench/ray_actor_cpu.py [--reps 2] [--window 30]

Since 2026-12-04 a rank's loop trains in a child of its actor (workers/runtime/rank_process.py); the
actor only relays events and answers the supervisor's polls. On a host whose cores the loops fill,
whatever the actors spend comes out of the loops (bench/notes/2026-12-05-ratio-chase.md). This bench starts a fresh local
Ray per measurement, two actors that import torch as a rank actor does, and reads their threads'
CPU time over a window: polled four times a second each (the supervisor's rate), not polled, and
polled under Ray settings that stretch its periodic reports. Variants run in a rotated order;
the ratio is each variant's median over the default's, measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.rank_threads import thread_counters  # noqa: E402
from bench.table import print_markdown_table  # noqa: E402

ACTORS = 2
POLL_S = 0.25  # the supervisor's poll interval
SLOW_REPORTS = {"RAY_task_events_report_interval_ms": "60000", "RAY_metrics_report_interval_ms": "600000",
                "RAY_core_worker_internal_heartbeat_ms": "60000"}
VARIANTS: dict[str, tuple[dict[str, str], bool]] = {  # name: (workers' RAY_* settings, polled)
    "default, polled": ({}, True),
    "default, not polled": ({}, False),
    "reports every 60 s or more, polled": (SLOW_REPORTS, True),
    "event stats off, polled": ({"RAY_event_stats": "0"}, True),
}


def thread_cpu(pid: int) -> dict[int, float]:
    """{thread id: CPU-seconds} of one process."""
    return {int(tid): counters[2] for tid, counters in thread_counters(pid).items()}


def measure(settings: dict[str, str], polled: bool, window_s: float) -> tuple[float, float]:
    """(the actors' CPU-s per second, the part on their main threads) over one window."""
    import ray

    from service.ray_client import worker_env

    @ray.remote
    class Actor:
        def __init__(self) -> None:
            import torch  # noqa: F401  (a rank actor has the training stack imported)

        def pid(self) -> int:
            return os.getpid()

        def poll(self) -> list:
            return []

    os.environ.pop("RAY_ADDRESS", None)
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {**worker_env(), **settings}})
    try:
        actors = [Actor.remote() for _ in range(ACTORS)]
        pids = ray.get([a.pid.remote() for a in actors])
        time.sleep(5)  # past the actors' start
        before = {pid: thread_cpu(pid) for pid in pids}
        t0 = time.time()
        while time.time() - t0 < window_s:
            if polled:
                ray.get([a.poll.remote() for a in actors])
            time.sleep(POLL_S)
        after = {pid: thread_cpu(pid) for pid in pids}
        elapsed = time.time() - t0
    finally:
        ray.shutdown()
    total = sum(after[p][t] - before[p].get(t, 0.0) for p in pids for t in after[p])
    main = sum(after[p][p] - before[p][p] for p in pids)
    return total / elapsed, main / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--window", type=float, default=30.0, help="seconds measured per run")
    args = parser.parse_args()
    names = list(VARIANTS)
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
    for rep in range(args.reps):
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            runs[name].append(measure(*VARIANTS[name], args.window))
            print(f"rep {rep} {name}: {runs[name][-1][0]:.4f} CPU-s/s", file=sys.stderr, flush=True)
    base = statistics.median(total for total, _ in runs[names[0]])
    body = []
    for name in names:
        totals = [total for total, _ in runs[name]]
        mains = [main for _, main in runs[name]]
        body.append((name, f"{statistics.median(totals):.4f} [{min(totals):.4f}-{max(totals):.4f}]",
                     f"{statistics.median(mains):.4f}", f"{statistics.median(totals) / base:.2f}"))
    print(f"{ACTORS} idle actors, {args.reps} runs of {args.window:.0f} s each, CPU-seconds per second:")
    print_markdown_table(("variant", "actors' CPU-s/s", "on their main threads", "/ default, polled"), body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
