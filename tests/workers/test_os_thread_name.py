"""workers/os_thread_name.py: a thread's name as the OS shows it (what bench/overhead.py groups threads by)."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from workers.os_thread_name import name_os_thread


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and prctl are Linux's")
def test_a_thread_names_itself_with_the_prefix_cut_to_the_os_limit():
    seen: list[str] = []

    def run():
        name_os_thread("a-very-long-thread-name")
        seen.append(Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip())

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == ["ty-a-very-long-"]  # 15 bytes: the kernel's limit
    # the calling thread keeps its own name
    assert not Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().startswith("ty-")
