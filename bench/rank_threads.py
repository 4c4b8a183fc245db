"""Per-thread counters of the training ranks on this host, while a bench runs beside it.

    .venv/bin/python bench/rank_threads.py --seconds 300 --out /tmp/threads.json &
    .venv/bin/python bench/hf_models.py --layouts fsdp --reps 2 --steps 40 --json /tmp/hf.json
    .venv/bin/python bench/rank_threads.py --report /tmp/threads.json --windows /tmp/hf.json

Ranks are Ray workers running a TrainWorker (Trainyard) and torchrun_hf.py processes with LOCAL_RANK
(torchrun). Every 0.5 s each rank thread's /proc stat, status, comm and schedstat are read: CPU time, minor page
faults, voluntary and involuntary context switches. The report takes each process over its run's
steady window when given the bench's --json (`--report F --windows HF.json`: the steps whose
samples/s the bench counts, and the CPU each sample took, the process's and its training thread's),
else from 40% of its sampled life. It prints per CPU-second rates for the training thread (the one
with the most CPU), the thread count and the threads that woke most, and per second of wall time
how long the training thread sat runnable on a run queue while something else held its core (the
scheduler's run-queue wait, /proc/<pid>/task/<tid>/schedstat): CPU that another process took from
the loop. A Trainyard rank is two processes (its actor, and the loop that actor forked): both are
listed; the loop is the one whose training thread is busy.

The sampler is not neutral: it reads four files per rank thread, and a Trainyard rank has about 50
threads to torchrun's 4, so it takes about 0.9% more of a 2-core host while Trainyard trains
(bench/notes/2026-12-05-ratio-chase.md, 2026-12-05 later). Use a sampled run for its counts, not for a throughput ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

CLK = os.sysconf("SC_CLK_TCK")


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError:
        return b""


def rank_kind(pid: int) -> str | None:
    """'trainyard', 'torchrun', None (not a rank), or '' (a Ray worker that may become one)."""
    cmd = _read(f"/proc/{pid}/cmdline").replace(b"\0", b" ")
    if b"TrainWorker" in cmd:
        return "trainyard"
    if b"torchrun_hf.py" in cmd and b"LOCAL_RANK=" in _read(f"/proc/{pid}/environ"):
        return "torchrun"
    return "" if cmd.startswith(b"ray::") or b"default_worker" in cmd else None


def thread_counters(pid: int) -> dict[str, list]:
    """thread id -> [name, minflt, cpu_s, voluntary, involuntary, run-queue wait_s]"""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        stat = _read(f"/proc/{pid}/task/{tid}/stat").decode()
        fields = stat[stat.rindex(")") + 2:].split()
        switches = dict(line.split(":\t") for line in _read(f"/proc/{pid}/task/{tid}/status").decode().splitlines()
                        if line.endswith(tuple("0123456789")) and "ctxt_switches" in line)
        out[tid] = [_read(f"/proc/{pid}/task/{tid}/comm").decode().strip(), int(fields[7]),
                    (int(fields[11]) + int(fields[12])) / CLK, int(switches.get("voluntary_ctxt_switches", 0)),
                    int(switches.get("nonvoluntary_ctxt_switches", 0)), _run_queue_wait_s(pid, tid)]
    return out


def _run_queue_wait_s(pid: int, tid: str) -> float:
    fields = _read(f"/proc/{pid}/task/{tid}/schedstat").split()
    return int(fields[1]) / 1e9 if len(fields) > 1 else 0.0


def sample(seconds: float, out: Path) -> None:
    kinds: dict[int, str | None] = {}
    samples: dict[int, list] = {}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            if not kinds.get(pid):
                kind = kinds[pid] = rank_kind(pid)
                if not kind:
                    continue
            try:
                samples.setdefault(pid, []).append([time.time(), thread_counters(pid)])
            except (OSError, ValueError):
                pass  # the process ended
        time.sleep(0.5)
    out.write_text(json.dumps({str(pid): {"kind": kinds[pid], "samples": s} for pid, s in samples.items()}))


Window = tuple[str, float, float, float]  # kind, start, end (time.time()), the run's samples/s over it


def bench_windows(path: Path | None) -> list[Window]:
    """Every run's steady window in a bench's --json output (bench/hf_models.py)."""
    if path is None:
        return []
    res = json.loads(path.read_text())
    return [(kind, *window, pair[f"{kind}_sps"]) for pairs in res["pairs"].values() for pair in pairs
            for kind, window in pair.get("steady_windows", {}).items() if window]


def sample_window(samples: list, kind: str, windows: list[Window]) -> tuple[int, int, float | None]:
    """Sample indices (start, end) to report a process over, and its run's samples/s: the bench's
    steady window of its run where one was given (the steps its samples/s counts), else from 40%
    of its sampled life to its last full sample. The second is approximate: a Trainyard loop lives
    long before and after its steps (setup; the final checkpoint and export; its actor's end)."""
    born, gone = samples[0][0], samples[-1][0]
    for window_kind, start, end, sps in windows:
        if window_kind == kind and born <= start and end <= gone:
            inside = [i for i, (t, _) in enumerate(samples) if start <= t <= end]
            if len(inside) >= 2:
                return inside[0], inside[-1], sps
    return int(len(samples) * 0.4), len(samples) - 2, None


def report(path: Path, windows: list[Window]) -> None:
    for pid, rec in json.loads(path.read_text()).items():
        s = rec["samples"]
        if len(s) < 6:
            continue
        start, end, sps = sample_window(s, rec["kind"], windows)
        (t0, first), (t1, _) = s[start], s[end]
        # Each thread's latest counters in the window: a thread that ended before its last sample
        # (a loop's gloo threads once its process group is gone) still counts.
        last: dict[str, list] = {}
        for _, threads in s[start:end + 1]:
            last.update(threads)
        rows = []
        for tid, (name, minflt, cpu, vol, invol, wait) in last.items():
            _, minflt0, cpu0, vol0, invol0, wait0 = first.get(tid, [name, 0, 0.0, 0, 0, 0.0])
            rows.append((name, cpu - cpu0, minflt - minflt0, vol - vol0, invol - invol0, wait - wait0))
        train = max(rows, key=lambda r: r[1])
        cpu = sum(r[1] for r in rows)
        woke = sorted((r for r in rows if r is not train), key=lambda r: -r[3])[:6]
        per_cpu_s = 1 / max(train[1], 1e-9)
        # CPU a sample costs this process: the same work done less efficiently (not just preempted) shows here
        trained = sps * (t1 - t0) if sps else 0.0  # training samples the run took in this window
        per_sample = f", {1000 * cpu / trained:.1f} ms/sample" if trained else ""
        train_per_sample = (f", CPU {1000 * train[1] / trained:.1f} ms/sample, "
                            f"minor faults/sample {train[2] / trained:.0f}" if trained else "")
        print(f"{rec['kind']:9s} pid {pid}: {len(rows)} threads, window {t1 - t0:.1f}s{' (steady)' if sps else ''}, "
              f"process CPU {cpu:.2f}s ({cpu / (t1 - t0):.3f} s/s{per_sample}), "
              f"minor faults/CPU-s {sum(r[2] for r in rows) / max(cpu, 1e-9):.0f}; training thread "
              f"involuntary/CPU-s {train[4] * per_cpu_s:.0f}, voluntary/CPU-s {train[3] * per_cpu_s:.0f}"
              f"{train_per_sample}, "
              f"run-queue wait {train[5] / (t1 - t0):.4f} s/s (CPU {train[1] / (t1 - t0):.3f} s/s); "
              f"most woken others: {[(r[0], r[3]) for r in woke]}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--report", type=Path)
    parser.add_argument("--windows", type=Path, help="the bench's --json: report each process over its steady steps")
    args = parser.parse_args()
    if args.report:
        report(args.report, bench_windows(args.windows))
    else:
        sample(args.seconds, args.out or Path("rank-threads.json"))
