"""Give the calling thread an OS-visible name (Linux `comm`, at most 15 bytes).

Python before 3.14 does not pass `Thread.name` to the OS, so every Python thread of a process shows the
name of the thread that started it in /proc/<pid>/task/<tid>/comm. Trainyard's own threads in a rank's
processes name themselves (prefix `ty-`) so that a per-thread CPU reading (bench/overhead.py) can tell
them from the training loop's and torch's threads. A no-op where the OS has no such call.
"""

from __future__ import annotations

import ctypes
import sys

PREFIX = "ty-"
_PR_SET_NAME = 15


def name_os_thread(name: str) -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, (PREFIX + name).encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):  # no libc prctl (a static or unusual runtime): the name is cosmetic
        pass
