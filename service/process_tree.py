"""The processes a process started, read from /proc, and waiting until they are gone.

`ray.shutdown()` signals the local Ray it started (GCS, raylet, agents) but returns before every
process has exited, and Ray's worker processes notice their raylet's death a moment later still.
A `trainyard serve` or `trainyard run` that owns its Ray waits for the whole tree, so that when
the command returns nothing of it is left running.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

PROC = Path("/proc")


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process we can read (none where /proc is absent)."""
    parents = {}
    for entry in PROC.glob("[0-9]*") if PROC.is_dir() else []:
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone between listing and reading
        # the command name (field 2) may hold spaces and parentheses: fields follow the last ')'
        fields = stat[stat.rfind(")") + 2:].split()
        parents[int(entry.name)] = int(fields[1])
    return parents


def descendants(pid: int | None = None) -> list[int]:
    """Every live process below `pid` (default: this one), children before grandchildren."""
    root = os.getpid() if pid is None else pid
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found, frontier = [], [root]
    while frontier:
        below = [c for p in frontier for c in children.get(p, [])]
        found += below
        frontier = below
    return found


def _alive(pid: int) -> bool:
    try:
        state = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return False
    return state[state.rfind(")") + 2:].split()[0] != "Z"  # a zombie has exited; its parent reaps it


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    """Wait until none of `pids` runs; SIGKILL what is left at the deadline. Returns the killed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    left = [p for p in pids if _alive(p)]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left
