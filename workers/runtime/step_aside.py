"""A rank actor steps aside for its training loop once the loop runs in its own process.

The actor's Ray core worker keeps ~45 threads, some waking about 100 times a second (signal checks,
gRPC pollers, timers), and answers the supervisor's polls. On a node whose cores the ranks fill,
each wakeup that lands on a loop's core preempts it, and a preempted rank stalls every collective
of its group. At a higher niceness the actor's threads still get the little CPU they need (about
1% of a core, bench/notes/2026-12-05-ratio-chase.md), but in the gaps the loops leave (waiting on a collective), rather
than by preempting them. The loop was forked at the actor's own niceness before this runs, and
keeps it: a process may lower its priority, not raise it back, without privileges.
"""

from __future__ import annotations

import os

ACTOR_NICENESS = 10  # weight ~110 against a nice-0 loop's 1024: ~10x what the actor needs when both want a core


def step_aside(niceness: int = ACTOR_NICENESS) -> int:
    """Lower every thread of this process to at least `niceness` (Linux applies a niceness per thread;
    threads started later inherit their creator's). Returns how many threads were changed."""
    changed = 0
    for _ in range(3):  # a thread started while the first pass ran is caught by the next
        pending = [tid for tid in _thread_ids() if _niceness(tid) < niceness]
        if not pending:
            break
        for tid in pending:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, niceness)
                changed += 1
            except ProcessLookupError:
                pass  # the thread ended meanwhile
            except PermissionError:  # a sandbox that forbids it: the actor keeps its priority, the rank trains
                return changed
    return changed


def _thread_ids() -> list[int]:
    try:
        return [int(tid) for tid in os.listdir("/proc/self/task")]
    except FileNotFoundError:  # no /proc: the calling thread only
        return [0]


def _niceness(tid: int) -> int:
    try:
        return os.getpriority(os.PRIO_PROCESS, tid)
    except ProcessLookupError:
        return 20  # ended: nothing to change
