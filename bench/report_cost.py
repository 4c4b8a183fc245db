"""What `trainyard.report` and `should_stop` cost a command rank: the call's own time, against the step it reports.

    .venv/bin/python bench/report_cost.py [--reports 500] [--step-ms 20]

A rank process (spawned, as a command rank is its own process) calls report() and then should_stop(), as
examples/torchrun-script/train.py does, over the session socket (trainyard/channel.py) to a SessionServer in
this process whose sink does nothing, once per step of --step-ms (a sleep, as bench/programs.py's steps),
twice in one run: each report sent as made, then in the channel's default batches. It prints the calls'
mean and 99th-percentile time, both as a fraction of the step (the part of a step the reporting adds
before the actor's own work), and the lines the actor's thread woke for per report (that work runs
beside the rank, in the actor's process, on the same CPUs).
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.table import print_markdown_table  # noqa: E402
from trainyard.channel import SEND_EVERY_S, SocketSession  # noqa: E402
from workers.program.session_server import SessionServer  # noqa: E402


class _NoSink:
    def report(self, metrics: dict, step: int | None, wall_s: float | None = None, own_s: float | None = None) -> None:
        pass


class _CountingServer(SessionServer):
    """Counts the lines the actor's thread wakes for: one per batch of reports (trainyard/channel.py)."""
    lines = 0

    def _answer(self, request: dict) -> dict:
        self.lines += 1
        return super()._answer(request)


def _rank(path: str, send_every_s: float, reports: int, step_s: float, out) -> None:
    session = SocketSession(path, send_every_s)
    times = []
    for i in range(reports + 50):  # the first 50: warm-up
        started = time.perf_counter()
        session.report({"loss": 1.0, "samples_per_s": 1000.0}, i + 1)
        session.should_stop()  # what a step does after reporting (examples/torchrun-script/train.py)
        if i >= 50:
            times.append(time.perf_counter() - started)
        time.sleep(step_s)
    out.put(times)


def measure(send_every_s: float, reports: int, step_s: float) -> list[str]:
    server = _CountingServer(_NoSink(), threading.Event())  # type: ignore[arg-type]
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    rank = ctx.Process(target=_rank, args=(server.path, send_every_s, reports, step_s, out))
    rank.start()
    times = sorted(out.get(timeout=reports * (step_s + 0.05) + 60))
    rank.join()
    server.close()
    mean, p99 = statistics.fmean(times), times[int(0.99 * (len(times) - 1))]
    return [f"{send_every_s * 1e3:g}", str(len(times)), f"{mean * 1e3:.3f}", f"{p99 * 1e3:.3f}",
            f"{mean / step_s:.4f}", f"{p99 / step_s:.4f}", f"{server.lines / (reports + 50):.3f}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=int, default=500)
    parser.add_argument("--step-ms", type=float, default=20.0)
    args = parser.parse_args()
    # Each report sent at once (as under injected faults, and as before batching), then the default batches.
    rows = [measure(every, args.reports, args.step_ms / 1000) for every in (0.0, SEND_EVERY_S)]
    print(f"{args.step_ms:g} ms steps")
    print_markdown_table(("batch every ms", "reports", "calls mean ms", "calls p99 ms", "mean / step", "p99 / step",
                          "lines to the actor / report"), rows)


if __name__ == "__main__":
    main()
