"""The simulator's two processes: the simulated cluster and the service on top of it."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.live import free_port, wait_ready

ROOT = Path(__file__).resolve().parents[2]
QUIET_VENDORS = {"RAY_USAGE_STATS_ENABLED": "0", "MLFLOW_DISABLE_TELEMETRY": "true",
                 "HF_HUB_DISABLE_TELEMETRY": "1"}


@dataclass
class Service:
    url: str
    port: int
    admin_token: str
    stats: Path
    cluster_address: tuple[str, int]
    authkey: bytes


def _spawn(args: list[str], log: Path, env: dict[str, str], nice: int = 0) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            env={**os.environ, **QUIET_VENDORS, "PYTHONPATH": str(ROOT), **env},
                            start_new_session=True, preexec_fn=(lambda: os.nice(nice)) if nice else None)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@contextmanager
def fleet_service(work: Path, database_url: str, cluster_args: list[str], settings: dict[str, str],
                  cluster_nice: int = 0):
    """The cluster process, then `trainyard serve` on it; both stopped (with their process groups) on exit.
    `cluster_nice`: the cluster process's niceness. It stands for the fleet's other machines, whose cores the
    control plane never shares: niced, it yields this host's cores to the service when both want them."""
    authkey = secrets.token_bytes(16)
    cluster_port, port = free_port(), free_port()
    admin = "ty_fleet_admin_" + secrets.token_hex(8)
    cluster = _spawn(["-m", "bench.fleet.cluster_process", "--port", str(cluster_port),
                      "--authkey-hex", authkey.hex(), *cluster_args], work / "cluster.log", {}, cluster_nice)
    server = None
    try:
        env = {"TRAINYARD_DATABASE_URL": database_url, "TRAINYARD_HOME": str(work / "home"),
               "TRAINYARD_ADMIN_TOKEN": admin, "TRAINYARD_PORT": str(port), "TRAINYARD_WARM_WORKERS": "0",
               "TRAINYARD_STANDBY_SUPERVISORS": "0", "TRAINYARD_MAX_ACTIVE_JOBS_PER_TENANT": "100000",
               "TRAINYARD_STORAGE_URI": str(work / "storage"), **settings}
        server = _spawn(["-m", "bench.fleet.serve", "--cluster", f"127.0.0.1:{cluster_port}",
                         "--authkey-hex", authkey.hex(), "--stats", str(work / "passes.json")],
                        work / "serve.log", env)
        wait_ready(server, f"http://127.0.0.1:{port}/readyz", work / "serve.log", "trainyard serve (fleet)", 120)
        yield Service(f"http://127.0.0.1:{port}", port, admin, work / "passes.json", ("127.0.0.1", cluster_port),
                      authkey)
    finally:
        if server is not None:
            _stop(server)
        _stop(cluster)
