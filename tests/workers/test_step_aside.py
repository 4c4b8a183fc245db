"""workers/runtime/step_aside.py: every thread of the calling process steps aside, a process forked
before it keeps its priority. Run in a spawned process, so that pytest's own threads keep theirs."""

from __future__ import annotations

import multiprocessing
import os
import threading

from tests.helpers import thread_niceness
from workers.runtime.step_aside import step_aside


def _actor_like(report, niceness: int) -> None:
    """Like a rank actor: threads of its own, a loop forked at its niceness, then step_aside."""
    done = threading.Event()
    helpers = [threading.Thread(target=done.wait) for _ in range(3)]
    for thread in helpers:
        thread.start()
    hold, release = os.pipe()
    loop_pid = os.fork()
    if loop_pid == 0:  # lives until the parent closes its end
        os.close(release)
        os.read(hold, 1)
        os._exit(0)
    changed = step_aside(niceness)
    late = threading.Thread(target=done.wait)  # started after: inherits its creator's niceness
    late.start()
    report.put((changed, thread_niceness(os.getpid()), thread_niceness(loop_pid)))
    done.set()
    os.close(release)
    os.waitpid(loop_pid, 0)


def test_every_thread_of_the_process_steps_aside_and_a_loop_forked_before_keeps_its_priority():
    context = multiprocessing.get_context("spawn")
    report = context.Queue()
    base = os.getpriority(os.PRIO_PROCESS, 0)  # whatever this test runs at
    process = context.Process(target=_actor_like, args=(report, base + 7))
    process.start()
    changed, own, loop = report.get(timeout=60)
    process.join(30)
    assert process.exitcode == 0
    assert changed >= 4  # the main thread and the three helpers (and whatever threads the interpreter keeps)
    assert len(own) >= 5 and set(own.values()) == {base + 7}, own
    assert set(loop.values()) == {base}, loop


def test_a_process_already_lower_is_left_as_it_is():
    context = multiprocessing.get_context("spawn")
    report = context.Queue()
    base = os.getpriority(os.PRIO_PROCESS, 0)
    process = context.Process(target=_lower_then_step_aside, args=(report, base))
    process.start()
    changed, own = report.get(timeout=60)
    process.join(30)
    assert changed == 0 and set(own.values()) == {base + 12}, own


def _lower_then_step_aside(report, base: int) -> None:
    step_aside(base + 12)
    report.put((step_aside(base + 7), thread_niceness(os.getpid())))  # never raises a thread's priority
