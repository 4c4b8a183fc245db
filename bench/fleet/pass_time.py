"""Where a control pass's time goes, in the service process (serve.py) and in the figures (__main__.py).

A pass's wall time is split four ways, all on the thread that runs it, so the parts add up to it:
- cpu: the thread's own CPU time (`time.thread_time()` around the pass), the driver's and the
  pickling's included;
- cluster wait: the time inside calls to the cluster port (port.py `rpc`) the thread spent off CPU,
  waiting for the simulated cluster process to answer;
- database: the time inside SQL statements (SQLAlchemy's before/after_cursor_execute engine events)
  and commits and rollbacks (the dialect's do_commit/do_rollback, which the engine calls for a
  transaction's end and for a pooled connection's reset) the thread spent off CPU, waiting for
  PostgreSQL;
- lock wait: the time spent waiting to take the reconciler's launch lock (which the other loop holds
  around its admissions and its reads of the jobs), off CPU;
- other: the rest, wall less the four: waiting for the GIL (the API, the metrics feed and the
  other loop run in the same interpreter), for another lock, or asleep.
The cluster wait is also kept by the port's operation (`cluster_ops`), for the slowest passes.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_local = threading.local()
PARTS = ("cpu", "cluster_wait", "database", "lock_wait")


def spent() -> dict[str, float]:
    """This thread's off-CPU seconds so far inside cluster calls and database calls."""
    totals = getattr(_local, "totals", None)
    if totals is None:
        totals = _local.totals = {"cluster_wait": 0.0, "database": 0.0, "lock_wait": 0.0}
    return totals


def cluster_ops() -> dict[str, float]:
    """This thread's off-CPU seconds so far inside cluster calls, by the port's operation."""
    ops = getattr(_local, "ops", None)
    if ops is None:
        ops = _local.ops = {}
    return ops


@contextmanager
def waiting_on(part: str, op: str | None = None) -> Iterator[None]:
    """Adds the off-CPU time of the block to this thread's `part` (and to its cluster `op`)."""
    wall, cpu = time.perf_counter(), time.thread_time()
    try:
        yield
    finally:
        waited = max(0.0, (time.perf_counter() - wall) - (time.thread_time() - cpu))
        spent()[part] += waited
        if op is not None:
            cluster_ops()[op] = cluster_ops().get(op, 0.0) + waited


class TimedLock:
    """A re-entrant lock whose callers' waits to take it count as their thread's `lock_wait`."""

    def __init__(self, lock: Any):
        self._lock = lock

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(blocking=False):
            return True
        with waiting_on("lock_wait"):
            return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _open_statement(*_args: Any) -> None:
    _local.statement = (time.perf_counter(), time.thread_time())


def _close_statement(*_args: Any) -> None:
    started = getattr(_local, "statement", None)
    if started is not None:
        _local.statement = None
        spent()["database"] += max(0.0, (time.perf_counter() - started[0]) - (time.thread_time() - started[1]))


def _timed(method: Callable) -> Callable:
    def run(self, *args, **kwargs):
        with waiting_on("database"):
            return method(self, *args, **kwargs)

    return run


def install_database_timing() -> None:
    """Time every engine's statements, commits and rollbacks in this process (once)."""
    from sqlalchemy import event
    from sqlalchemy.engine import Engine
    from sqlalchemy.engine.default import DefaultDialect

    if getattr(install_database_timing, "done", False):
        return
    event.listen(Engine, "before_cursor_execute", _open_statement)
    event.listen(Engine, "after_cursor_execute", _close_statement)
    event.listen(Engine, "handle_error", _close_statement)
    DefaultDialect.do_commit = _timed(DefaultDialect.do_commit)  # type: ignore[method-assign]
    DefaultDialect.do_rollback = _timed(DefaultDialect.do_rollback)  # type: ignore[method-assign]
    install_database_timing.done = True  # type: ignore[attr-defined]


class PassClock:
    """Started at a pass's beginning on its thread; `parts()` at its end: cpu, cluster_wait, database,
    lock_wait, and the cluster wait by operation (those over 10 ms)."""

    def __init__(self):
        self.cpu = time.thread_time()
        self.before = dict(spent())
        self.ops_before = dict(cluster_ops())

    def parts(self) -> tuple[float, float, float, float, dict[str, float]]:
        now = spent()
        ops = {op: round(t - self.ops_before.get(op, 0.0), 3) for op, t in cluster_ops().items()}
        return (time.thread_time() - self.cpu, now["cluster_wait"] - self.before["cluster_wait"],
                now["database"] - self.before["database"], now["lock_wait"] - self.before["lock_wait"],
                {op: t for op, t in ops.items() if t >= 0.01})


def pass_parts(passes: list[list], since: float, p99: Callable[[list[float]], float | None]) -> dict[str, Any]:
    """The figures of each loop's passes that ended after `since` (serve.py's records: loop, thread,
    started, seconds, serial seconds, cpu, cluster wait, database, lock wait, cluster wait by
    operation): the pass's CPU p50 and p99, the
    p99 of each wait, and the p99 of the wall time of the same passes (as timed)."""
    out: dict[str, Any] = {}
    for loop in ("reconcile", "schedule"):
        rows = [p for p in passes if p[0] == loop and len(p) >= 8 and p[2] + p[3] >= since]
        wall = [p[3] for p in rows]
        cpu = [p[5] for p in rows]
        cluster = [p[6] for p in rows]
        database = [p[7] for p in rows]
        lock = [p[8] if len(p) > 8 else 0.0 for p in rows]
        other = [max(0.0, p[3] - p[5] - p[6] - p[7] - lk) for p, lk in zip(rows, lock)]
        out.update({f"{loop}_pass_cpu_p50_s": sorted(cpu)[len(cpu) // 2] if cpu else None,
                    f"{loop}_pass_cpu_p99_s": p99(cpu), f"{loop}_cluster_wait_p99_s": p99(cluster),
                    f"{loop}_database_p99_s": p99(database), f"{loop}_lock_wait_p99_s": p99(lock),
                    f"{loop}_other_wait_p99_s": p99(other),
                    f"{loop}_pass_timed_p99_s": p99(wall), f"{loop}_passes_split": len(rows)})
    return out


def thread_cpu() -> dict[str, float]:
    """CPU seconds so far of this process's live threads, summed by name (numbered pool threads under one
    name), from /proc (utime + stime): where the service process's CPU goes beside the passes."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for t in threading.enumerate():
        try:
            fields = open(f"/proc/self/task/{t.native_id}/stat").read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # ended meanwhile
        name = re.sub(r"[-_ ]?\d+$", "", t.name) or t.name
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def cpu_shares(before: dict[str, float], after: dict[str, float], seconds: float, top: int = 8) -> dict[str, float]:
    """Each thread group's CPU over a window, in cores (CPU seconds per second), the busiest first."""
    used = {name: (after[name] - before.get(name, 0.0)) / seconds for name in after}
    return {name: round(v, 3) for name, v in sorted(used.items(), key=lambda kv: -kv[1])[:top]}


def slowest_passes(passes: list[list], since: float, loop: str, n: int = 3) -> list[dict[str, float]]:
    """The `n` slowest passes of a loop that ended after `since`, each split as pass_parts splits them."""
    rows = sorted((p for p in passes if p[0] == loop and len(p) >= 8 and p[2] + p[3] >= since), key=lambda p: -p[3])
    out = []
    for p in rows[:n]:
        lock = p[8] if len(p) > 8 else 0.0
        out.append({"wall": round(p[3], 3), "cpu": round(p[5], 3), "cluster_wait": round(p[6], 3),
                    "database": round(p[7], 3), "lock_wait": round(lock, 3),
                    "other": round(max(0.0, p[3] - p[5] - p[6] - p[7] - lock), 3),
                    "cluster_ops": p[9] if len(p) > 9 else {}})
    return out
