"""`trainyard serve` on the simulated cluster: the service's own app, settings and uvicorn options,
with the cluster port pointed at the cluster process instead of Ray.

    python -m bench.fleet.serve --cluster 127.0.0.1:PORT --authkey-hex K --stats FILE

TRAINYARD_* variables configure it as they configure `trainyard serve`. Each control-loop pass
(the reconciler's and the scheduler's `tick`) is timed where it runs, and the durations, with the
thread that ran them, the part the simulated cluster's one-after-another answering added, and the
pass's CPU, cluster wait and database time (bench/fleet/pass_time.py), are written to FILE every
second for the simulator to read. With TRAINYARD_API_WORKERS=N it runs N processes on the port as
`trainyard serve` does (this one the primary: the control plane and the API; N - 1 API workers
beside it).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import threading
import time
from functools import wraps
from pathlib import Path

from api.cli.processes import LOG_FORMAT, run_uvicorn, serve_processes, uvicorn_options
from api.http.app import create_app
from bench.fleet.pass_time import PassClock, TimedLock, install_database_timing, thread_cpu
from bench.fleet.port import SimulatedClusterPort
from service.reconciler import Reconciler
from service.scheduler import Scheduler
from service.settings import get_settings

# (loop, thread, started, seconds, serial seconds, cpu, cluster wait, database, lock wait, cluster wait
# by operation: bench/fleet/pass_time.py)
PASSES: list[tuple] = []
IN_FLIGHT: dict[str, tuple[str, float]] = {}  # thread -> (loop, started): a pass not over yet


def timed(loop: str, tick, port: SimulatedClusterPort):
    """The pass's wall time, and how much of it the cluster process spent answering the pass's
    gathers one after another beyond the slowest answer of each (what Ray's actors, answering in
    parallel, would not have cost it), and where its time went (bench/fleet/pass_time.py)."""
    @wraps(tick)
    def run(self, *args, **kwargs):
        started, thread = time.monotonic(), threading.current_thread().name
        serial_before = port.serial_s.get(thread, 0.0)
        clock = PassClock()
        IN_FLIGHT[thread] = (loop, started)
        try:
            return tick(self, *args, **kwargs)
        finally:
            parts = clock.parts()  # taken inside the wall time's bracket: cpu <= wall
            IN_FLIGHT.pop(thread, None)
            PASSES.append((loop, thread, started, time.monotonic() - started,
                           port.serial_s.get(thread, 0.0) - serial_before, *parts))

    return run


def write_stats(path: Path, port: SimulatedClusterPort) -> None:
    while True:
        time.sleep(1.0)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"passes": PASSES[:], "in_flight": dict(IN_FLIGHT), "now": time.monotonic(),
                                   "cluster_calls": port.calls, "thread_cpu": thread_cpu()}))
        tmp.replace(path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--cluster", required=True, help="host:port of bench/fleet/cluster_process.py")
    p.add_argument("--authkey-hex", required=True)
    p.add_argument("--stats", type=Path, required=True)
    a = p.parse_args()
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    logging.basicConfig(level=logging.WARNING, format=LOG_FORMAT)
    host, port_s = a.cluster.rsplit(":", 1)
    port = SimulatedClusterPort((host, int(port_s)), bytes.fromhex(a.authkey_hex))
    install_database_timing()  # before the service makes its engines
    Reconciler.tick = timed("reconcile", Reconciler.tick, port)  # type: ignore[method-assign]
    made = Reconciler.__init__

    @wraps(made)
    def timed_lock(self, *args, **kwargs):  # the launch lock's waits counted as the pass's lock wait
        made(self, *args, **kwargs)
        self.launch_lock = TimedLock(self.launch_lock)

    Reconciler.__init__ = timed_lock  # type: ignore[method-assign]
    Scheduler.tick = timed("schedule", Scheduler.tick, port)  # type: ignore[method-assign]
    # the supervisors' starts after a tick's admissions, outside the launch lock: timed apart, not a pass
    Scheduler.launch_pending = timed("launch", Scheduler.launch_pending, port)  # type: ignore[method-assign]
    threading.Thread(target=write_stats, args=(a.stats, port), daemon=True).start()
    settings = get_settings()
    if settings.api_workers > 1:
        serve_processes(settings, settings.host, settings.port, settings.api_workers, cluster=port)
        return
    run_uvicorn(create_app(settings, cluster=port), uvicorn_options(settings), settings.request_read_timeout_s,
                host=settings.host, port=settings.port)


if __name__ == "__main__":
    main()
