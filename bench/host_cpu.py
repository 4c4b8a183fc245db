"""CPU use of every process on this host, by kind, over a time window: what runs beside the ranks.

    sampler = HostCpu(); sampler.start()          # a thread reading /proc/<pid>/stat each second
    ... run something, note its steady window (t0, t1) in time.time() ...
    sampler.shares(t0, t1)   # {kind: CPU-seconds per second}, e.g. {"ranks": 1.93, "ray": 0.05, ...}

Kinds come from each process's command line: the training ranks (the loop a Ray TrainWorker forked,
a torchrun script's LOCAL_RANK process, a spawned local rank), the rank actors themselves (Ray's
core worker beside the loop), the job's supervisor actor, Ray's own daemons,
idle Ray workers, this process, and everything else.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

CLK = os.sysconf("SC_CLK_TCK")
RAY_DAEMONS = (b"raylet", b"gcs_server", b"dashboard", b"log_monitor", b"runtime_env", b"monitor.py",
               b"ray/_private", b"agent")


STABLE = ("ranks", "supervisor", "ray daemons", "this process")  # "rank actors" may fork a loop later


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError:
        return b""


def kind_of(pid: int) -> str:
    if pid == os.getpid():
        return "this process"
    cmd = _read(f"/proc/{pid}/cmdline").replace(b"\0", b" ")
    if b"TrainWorker" in cmd:  # a rank's loop is forked from its actor (workers/runtime/rank_process.py)
        return "ranks" if b"TrainWorker" in _read(f"/proc/{_parent(pid)}/cmdline") else "rank actors"
    if b"spawn_main" in cmd or (b"torchrun_hf.py" in cmd and b"LOCAL_RANK=" in _read(f"/proc/{pid}/environ")):
        return "ranks"
    if b"JobSupervisor" in cmd:
        return "supervisor"
    if cmd.startswith(b"ray::IDLE") or b"default_worker" in cmd:
        return "idle ray workers"
    if any(d in cmd for d in RAY_DAEMONS):
        return "ray daemons"
    return "other"


def _parent(pid: int) -> int:
    stat = _read(f"/proc/{pid}/stat").decode()
    return int(stat[stat.rindex(")") + 2:].split()[1]) if stat else 0


def cpu_seconds(pid: int) -> float | None:
    stat = _read(f"/proc/{pid}/stat").decode()
    if not stat:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK


class HostCpu:
    def __init__(self, interval_s: float = 1.0) -> None:
        self.interval_s = interval_s
        self.samples: list[tuple[float, dict[int, tuple[str, float]]]] = []
        self._kinds: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            now, seen = time.time(), {}
            for entry in os.listdir("/proc"):
                if entry.isdigit():
                    pid = int(entry)
                    cpu = cpu_seconds(pid)
                    if cpu is not None:
                        kind = self._kinds.get(pid) or kind_of(pid)
                        if kind in STABLE:  # a Ray worker's command line changes when it becomes an actor
                            self._kinds[pid] = kind
                        seen[pid] = (kind, cpu)
            self.samples.append((now, seen))
            self._stop.wait(self.interval_s)

    def shares(self, t0: float, t1: float) -> dict[str, float]:
        """CPU-seconds per second of each kind between the samples nearest t0 and t1 (processes that
        started or ended inside the window count from their first or to their last sample)."""
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        if len(inside) < 2:
            return {}
        (a_t, a), (b_t, b) = inside[0], inside[-1]
        out: dict[str, float] = {}
        for pid, (kind, cpu) in b.items():
            out[kind] = out.get(kind, 0.0) + cpu - a.get(pid, (kind, 0.0))[1]
        return {k: v / (b_t - a_t) for k, v in sorted(out.items())}
