"""Per-process, per-thread CPU of a job's process tree, read from /proc, and who counts as what.

The accounting behind bench/overhead.py (whose docstring says what is counted where and why):
`Sampler` snapshots utime + stime of every thread below a root process; `account` turns two
snapshots into one row per process, its CPU split into the training loop's, Trainyard's and Ray's.
Pure functions on `Snapshot`s, so tests/bench/test_overhead.py checks them on hand-built readings.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

TARGET = 0.02  # Trainyard's CPU per step at most 2% of the loop's
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
TY_THREAD = "ty-"  # workers/os_thread_name.PREFIX (not imported: this module reads /proc only)

# Each process's role: its row's group, and where its CPU counts (Ray's: not in Trainyard's figure)
LOOP, RANK_ACTOR, SUPERVISOR, CONTROL_PLANE, TRAINYARD_OTHER, RAY = (
    "rank training process", "rank actor", "supervisor", "control plane", "other Trainyard", "Ray")
RAY_ACTORS = ("ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent")  # Ray's own worker processes


# --- reading /proc ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    title: str  # the command line as the process shows it (Ray actors: `ray::TrainWorker.train`)
    threads: dict[int, tuple[str, float]]  # tid -> (name, CPU seconds)
    started: int = 0  # clock ticks after boot: with the pid, names this process and no later one


@dataclass(frozen=True)
class Snapshot:
    t: float  # time.time() when read
    procs: dict[int, Proc]


def _stat_fields(text: str) -> tuple[str, list[str]]:
    """(comm, the fields after it) of a /proc stat line; comm may hold spaces and parentheses."""
    return text[text.index("(") + 1:text.rfind(")")], text[text.rfind(")") + 2:].split()


def read_proc(pid: int, proc: Path = Path("/proc")) -> Proc | None:
    base = proc / str(pid)
    try:
        _, fields = _stat_fields((base / "stat").read_text())
        title = (base / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        tids = [int(t) for t in os.listdir(base / "task")]
    except (OSError, ValueError):
        return None  # gone meanwhile
    threads = {}
    for tid in tids:
        try:
            name, tf = _stat_fields((base / "task" / str(tid) / "stat").read_text())
        except (OSError, ValueError):
            continue
        threads[tid] = (name, (int(tf[11]) + int(tf[12])) * TICK_S)  # utime + stime (fields 14, 15)
    return Proc(pid, int(fields[1]), title, threads, int(fields[19]))  # ppid, starttime: fields 4, 22


def tree_pids(root: int, proc: Path = Path("/proc")) -> list[int]:
    """`root` and every live process below it."""
    children: dict[int, list[int]] = {}
    for entry in proc.glob("[0-9]*"):
        try:
            _, fields = _stat_fields((entry / "stat").read_text())
        except (OSError, ValueError):
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, frontier = [root], [root]
    while frontier:
        frontier = [c for p in frontier for c in children.get(p, [])]
        found += frontier
    return found


class Sampler:
    """Snapshots of the tree below `root` every `interval_s`, in a thread of this (uncounted) process.
    The tree itself is re-listed every `relist_s` (a scan of all of /proc), the known pids read between."""

    def __init__(self, root: int, interval_s: float = 0.5, relist_s: float = 2.0):
        self.root, self.interval_s, self.relist_s = root, interval_s, relist_s
        self.snapshots: list[Snapshot] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="overhead-sampler", daemon=True)

    def _loop(self) -> None:
        pids: list[int] = []
        listed = 0.0
        while True:
            if time.monotonic() - listed > self.relist_s:
                pids, listed = tree_pids(self.root), time.monotonic()
            t = time.time()
            procs = {p.pid: p for p in (read_proc(pid) for pid in pids) if p is not None}
            self.snapshots.append(Snapshot(t, procs))
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


# --- who is who -------------------------------------------------------------------------------


def classify(procs: dict[int, Proc], serve_pid: int, loop_ranks: dict[int, int]) -> dict[int, tuple[str, str]]:
    """pid -> (role, label) for every process seen. `loop_ranks`: each rank's training process (pid -> rank)."""
    actor_rank = {procs[pid].ppid: rank for pid, rank in loop_ranks.items() if pid in procs}
    roles = {}
    for pid, p in procs.items():
        title = p.title
        if pid == serve_pid:
            roles[pid] = (CONTROL_PLANE, "trainyard serve")
        elif pid in loop_ranks:
            roles[pid] = (LOOP, f"rank {loop_ranks[pid]} training process")
        elif title.startswith("ray::TrainWorker"):
            rank = actor_rank.get(pid)
            roles[pid] = (RANK_ACTOR, f"rank {rank} actor" if rank is not None else "rank actor (no loop seen)")
        elif title.startswith("ray::JobSupervisor"):
            roles[pid] = (SUPERVISOR, "supervisor actor")
        elif title.startswith(RAY_ACTORS) or (not title.startswith("ray::") and _is_ray_daemon(title)):
            roles[pid] = (RAY, _ray_label(title))
        else:
            roles[pid] = (TRAINYARD_OTHER, title[:40] or f"pid {pid}")
    return roles


def _is_ray_daemon(title: str) -> bool:
    return any(k in title for k in ("gcs_server", "raylet", "/ray/", "ray/_private", "ray/dashboard"))


def _ray_label(title: str) -> str:
    for key, label in (("ray::IDLE", "idle Ray worker"), ("ray::DashboardAgent", "dashboard agent"),
                       ("ray::RuntimeEnvAgent", "runtime env agent"), ("gcs_server", "gcs_server"),
                       ("raylet", "raylet"),
                       ("log_monitor", "log monitor"), ("runtime_env", "runtime env agent"),
                       ("dashboard/agent", "dashboard agent"), ("dashboard", "dashboard"),
                       ("monitor.py", "autoscaler monitor")):
        if key in title:
            return label
    return title.split()[0].rsplit("/", 1)[-1][:30]


def is_loop_thread(proc: Proc, tid: int, name: str) -> bool:
    """In a rank's training process: the main thread and torch's and gloo's; not Trainyard's named ones."""
    return tid == proc.pid or not name.startswith(TY_THREAD)


# --- the accounting ---------------------------------------------------------------------------


@dataclass
class Row:
    pid: int
    role: str
    label: str
    cpu_s: float = 0.0  # the process's CPU in the window
    loop_s: float = 0.0  # of which the training loop's (rank training processes only)
    threads: dict[str, list[float]] = field(default_factory=dict)  # thread group -> CPU s of each thread in it

    @property
    def trainyard_s(self) -> float:
        return 0.0 if self.role == RAY else self.cpu_s - self.loop_s

    @property
    def ray_s(self) -> float:
        return self.cpu_s if self.role == RAY else 0.0


@dataclass
class Accounting:
    steps: int
    window_s: float
    rows: list[Row]

    @property
    def loop_s(self) -> float:
        return sum(r.loop_s for r in self.rows)

    @property
    def trainyard_s(self) -> float:
        return sum(r.trainyard_s for r in self.rows)

    @property
    def ray_s(self) -> float:
        return sum(r.ray_s for r in self.rows)

    @property
    def fraction(self) -> float:
        """Trainyard's CPU beyond the loop over the loop's, in the same window (steps cancel)."""
        return self.trainyard_s / self.loop_s

    def per_step_ms(self, seconds: float) -> float:
        return 1000.0 * seconds / self.steps

    @property
    def loop_utilisation(self) -> float:
        """The share of one core each rank's loop had over the window (1.0: its core to itself)."""
        ranks = sum(1 for r in self.rows if r.role == LOOP)
        return self.loop_s / self.window_s / max(1, ranks)

    @property
    def fraction_at_full_cores(self) -> float:
        """An estimate, not a reading: the fraction had each loop filled its core, if all of Trainyard's CPU
        is paid per second (polls, Ray's timers) and none per step. On a host whose other work slows the
        steps, a cost paid per second weighs more per step; this takes that out. Low by the part paid per step
        (relaying and storing each step's record), which does not shrink with the step's wall time."""
        return self.fraction * min(1.0, self.loop_utilisation)

    def as_dict(self) -> dict:
        return {"steps": self.steps, "window_s": self.window_s, "loop_s": self.loop_s,
                "trainyard_s": self.trainyard_s, "ray_s": self.ray_s, "fraction": self.fraction,
                "target": TARGET, "meets_target": self.fraction <= TARGET,
                "loop_utilisation": self.loop_utilisation, "fraction_at_full_cores": self.fraction_at_full_cores,
                "rows": [{"pid": r.pid, "role": r.role, "label": r.label, "cpu_s": r.cpu_s, "loop_s": r.loop_s,
                          "trainyard_s": r.trainyard_s, "ray_s": r.ray_s,
                          "threads": {k: sum(v) for k, v in r.threads.items()}} for r in self.rows]}


def thread_group(role: str, proc: Proc, tid: int, name: str) -> str:
    """Threads are grouped by their OS name (gloo's `gloo_tcp_loop`, Ray's `worker.io`, ...); Python and
    torch threads that name nothing show their process's name."""
    if tid == proc.pid:  # a Ray worker's main thread runs its task loop and checks for signals every 10 ms
        return "training thread (main)" if role == LOOP else f"main thread ({name})"
    return name


def account(snapshots: list[Snapshot], i_a: int, i_b: int, steps: int, serve_pid: int,
            loop_ranks: dict[int, int]) -> Accounting:
    """The CPU of every process and thread between snapshots i_a and i_b, by role. A process or thread
    first seen after i_a counts from zero (it started in the window); one gone before i_b up to its last
    reading."""
    if steps < 1 or not 0 <= i_a < i_b < len(snapshots):
        raise ValueError(f"no steady window: snapshots {i_a}..{i_b} of {len(snapshots)}, {steps} steps")
    window = snapshots[i_a:i_b + 1]
    last: dict[int, Proc] = {}
    for snap in window:
        last.update(snap.procs)
    roles = classify(last, serve_pid, loop_ranks)
    start = snapshots[i_a].procs
    rows = []
    for pid, proc in sorted(last.items()):
        role, label = roles[pid]
        row = Row(pid, role, label)
        before = start[pid].threads if pid in start and start[pid].started == proc.started else {}  # not a reused pid
        seen: dict[int, tuple[str, float]] = {}
        for snap in window:  # each thread's last reading in the window
            if pid in snap.procs:
                seen.update(snap.procs[pid].threads)
        for tid, (name, cpu) in seen.items():
            delta = max(0.0, cpu - before.get(tid, (name, 0.0))[1])
            row.cpu_s += delta
            if role == LOOP and is_loop_thread(proc, tid, name):
                row.loop_s += delta
            row.threads.setdefault(thread_group(role, proc, tid, name), []).append(delta)
        rows.append(row)
    return Accounting(steps, snapshots[i_b].t - snapshots[i_a].t, rows)


def steady_window(snapshots: list[Snapshot], step_ts: dict[int, float], warmup: int,
                  steps: int) -> tuple[int, int, int]:
    """(i_a, i_b, steps finished in between): from the first snapshot after step `warmup` finished to
    the last one before step `warmup + steps` finished."""
    missing = [s for s in (warmup, warmup + steps) if s not in step_ts]
    if missing:
        raise ValueError(f"the job's series has no step {missing} (steps {min(step_ts)}..{max(step_ts)})")
    t0, t1 = step_ts[warmup], step_ts[warmup + steps]
    i_a = next((i for i, s in enumerate(snapshots) if s.t >= t0), None)
    i_b = next((i for i in range(len(snapshots) - 1, -1, -1) if snapshots[i].t <= t1), None)
    if i_a is None or i_b is None or i_b <= i_a:
        raise ValueError("no two readings inside the steady window: lengthen it (--steps) or read more often")
    ta, tb = snapshots[i_a].t, snapshots[i_b].t
    return i_a, i_b, sum(1 for t in step_ts.values() if ta < t <= tb)
