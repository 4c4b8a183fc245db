"""service/process_tree.py on real processes: a tree found to any depth, and waited for or killed."""

from __future__ import annotations

import subprocess
import sys
import time

from service.process_tree import descendants, wait_gone

# A child that starts a grandchild and prints its pid, then both sleep.
SPAWNER = ("import subprocess, sys, time; "
           "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
           "print(g.pid, flush=True); time.sleep(60)")


def test_a_grandchild_is_found_and_an_orphan_is_killed_at_the_deadline():
    child = subprocess.Popen([sys.executable, "-c", SPAWNER], stdout=subprocess.PIPE, text=True)
    try:
        grandchild = int(child.stdout.readline())
        tree = descendants()
        assert child.pid in tree and grandchild in tree
        assert tree.index(child.pid) < tree.index(grandchild)  # children before grandchildren
        assert descendants(child.pid) == [grandchild]

        child.kill()
        child.wait()  # the grandchild is an orphan now: no tree leads to it, the list still does
        assert grandchild not in descendants()
        started = time.monotonic()
        assert wait_gone([child.pid, grandchild], timeout_s=0.5) == [grandchild]
        assert 0.5 <= time.monotonic() - started < 5
        assert wait_gone([grandchild], timeout_s=5) == []  # gone: nothing to wait for
    finally:
        child.kill()


def test_processes_that_exit_in_time_are_waited_for_not_killed():
    quick = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    started = time.monotonic()
    assert wait_gone([quick.pid], timeout_s=20) == []  # a zombie until reaped counts as gone
    assert time.monotonic() - started < 10
    quick.wait()
