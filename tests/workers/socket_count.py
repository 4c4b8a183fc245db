"""TCP connections this process holds open (ESTABLISHED), read from /proc: what a gloo group costs."""

from __future__ import annotations

import os


def established_connections() -> int:
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.read().splitlines()[1:]:
                fields = line.split()
                count += fields[3] == "01" and fields[9] in inodes  # 01: ESTABLISHED
    return count
