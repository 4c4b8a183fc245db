"""After a failed pytest run in `make test`: which test it was running when it stopped, and the end
of its Ray driver log (a driver whose raylet or GCS went away is ended by Ray's core worker, with no
pytest summary). Usage: python -m tests.died_during PROGRESS_FILE EXIT_CODE"""

from __future__ import annotations

import glob
import sys
from pathlib import Path


def main(progress: str, code: str) -> None:
    path = Path(progress)
    if not path.exists():
        return
    pid, nodeid = path.read_text().split(" ", 1)
    print(f"pytest (pid {pid}) exited {code}; the last test it started: {nodeid.strip()}")
    for log in sorted(glob.glob(f"/tmp/ray/session_*/logs/python-core-driver-*_{pid}.log")):
        lines = Path(log).read_text(errors="replace").splitlines()
        print(f"--- the last lines of {log}:", *lines[-25:], sep="\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
