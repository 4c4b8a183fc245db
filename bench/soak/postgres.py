"""A private PostgreSQL for the soak: its own data directory and port, so that restarting it (a chaos
fault) never touches the machine's shared server on 5432."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import time
from pathlib import Path

from tests.live import free_port


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError(f"no PostgreSQL {name} under /usr/lib/postgresql/*/bin")
    return found[-1]


class PrivatePostgres:
    """initdb + pg_ctl in a temporary directory; run as `postgres` when we are root (initdb refuses root)."""

    def __init__(self, root: Path):
        self.root, self.data, self.port = root, root / "pgdata", free_port()
        self.log = root / "postgres.log"
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str, timeout: float = 120) -> None:
        cmd = list(args)
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=timeout)

    def _ctl(self, action: str) -> None:
        # -w: pg_ctl returns once the server accepts connections (or is down); fast shutdown aborts sessions
        self._run(_bin("pg_ctl"), action, "-D", str(self.data), "-l", str(self.log), "-w", "-m", "fast",
                  "-o", f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c max_connections=200 "
                        "-c fsync=off")

    def start(self) -> PrivatePostgres:
        """initdb on the first start; a later one (after `stop`) starts the same database again."""
        if not (self.data / "PG_VERSION").exists():
            self.root.mkdir(parents=True, exist_ok=True)
            if os.geteuid() == 0:
                shutil.chown(self.root, "postgres")
                self.log.touch()
                shutil.chown(self.log, "postgres")
            self._run(_bin("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        self._ctl("start")
        return self

    def restart(self) -> float:
        """pg_ctl restart: every connection is cut. Returns the wall time it took."""
        t0 = time.time()
        self._ctl("restart")
        return time.time() - t0

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._ctl("stop")
