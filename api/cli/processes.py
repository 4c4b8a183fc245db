"""`trainyard serve --workers N`: N processes answer the API on one port.

One Python process tops out at one core: the GIL serialises request handling. With N > 1 the
`trainyard serve` process (the primary) runs the whole control plane (Ray, scheduler,
reconciler, leader lease) and answers requests, and spawns N - 1 API workers. Each process
listens on the port with SO_REUSEPORT, so the kernel spreads new connections evenly over them
(one shared socket would not: an event loop that wakes first accepts a whole burst). API workers
answer from the shared database and a little shared state (service/shared_state.py); they never
connect to Ray. Their HTTP timings go to the primary, and a /metrics request that reaches a worker
is answered by the primary (over a private loopback port), so every scrape sees the whole server.

The primary restarts a worker that dies (crash, OOM kill) and stops them all when it stops.
With SQLite, writers of all the processes queue on one file lock (service/db/engine.py).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import socket
import threading
from collections.abc import Callable

log = logging.getLogger("trainyard.processes")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def uvicorn_options(settings) -> dict:
    """The uvicorn settings of every process (plain values: they travel to spawned workers)."""
    return dict(access_log=settings.access_log, log_level="info", timeout_graceful_shutdown=5,
                timeout_keep_alive=settings.keep_alive_timeout_s, backlog=2048)


def run_uvicorn(app, options: dict, read_timeout_s: float, sockets: list[socket.socket] | None = None,
                host: str | None = None, port: int | None = None) -> None:
    import uvicorn

    from api.http.slow_clients import bounded_http

    config = uvicorn.Config(app, host=host or "127.0.0.1", port=port or 8600, http=bounded_http(read_timeout_s),
                            **options)
    uvicorn.Server(config).run(sockets=sockets)


def listen(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def serve_processes(settings, host: str, port: int, workers: int, cluster=None) -> None:
    """Run the primary in this process and `workers - 1` API workers beside it. `cluster`: what the
    primary's control plane runs jobs on (None: Ray; the fleet simulator passes its own)."""
    from api.http.app import create_app
    from service.shared_state import SharedState

    ctx = mp.get_context("spawn")  # never fork a process that holds threads and a Ray connection
    try:  # refused if anyone holds the port, even another reuse-port server (which would share it)
        listen(host, port).close()
        public = listen(host, port, reuse_port=True)
    except OSError as exc:
        raise SystemExit(f"trainyard serve: cannot listen on {host}:{port}: {exc.strerror}") from None
    port = public.getsockname()[1]  # the real one, if port 0 asked for any
    private = listen("127.0.0.1", 0)  # the workers' way to the primary's /metrics
    shared = SharedState(ctx, f"http://127.0.0.1:{private.getsockname()[1]}", workers - 1)
    options = uvicorn_options(settings)
    group = ApiWorkers(ctx, workers - 1, (host, port), shared, options, settings.request_read_timeout_s)

    def started(plane) -> Callable[[], None]:
        drain = threading.Thread(target=_drain_http, args=(shared, plane), name="trainyard-http-timings", daemon=True)
        drain.start()
        group.start()
        log.info("serving on %s:%d with %d processes (1 primary, %d API workers)", host, port, workers, workers - 1)
        return group.stop

    app = create_app(settings, shared, api_only=False, on_started=started, cluster=cluster)
    run_uvicorn(app, options, settings.request_read_timeout_s, sockets=[public, private])


def _drain_http(shared, plane) -> None:
    while True:
        method, route, status, seconds = shared.http.get()
        plane.live.http(method, route, status, seconds)


class ApiWorkers:
    """The primary's API worker processes: started once the control plane is up (the database is
    migrated, the admin token exists), restarted when one dies, stopped with the primary."""

    def __init__(self, ctx, n: int, address: tuple[str, int], shared, options: dict, read_timeout_s: float):
        self.ctx, self.n, self.address, self.shared = ctx, n, address, shared
        self.options, self.read_timeout_s = options, read_timeout_s
        self.procs: list = []
        self._stopping = threading.Event()
        self._watch: threading.Thread | None = None

    def _spawn(self):
        proc = self.ctx.Process(target=api_worker_main, name="trainyard-api-worker", daemon=False,
                                args=(self.address, self.shared, self.options, self.read_timeout_s))
        proc.start()
        return proc

    def start(self) -> None:
        self.procs = [self._spawn() for _ in range(self.n)]
        self._watch = threading.Thread(target=self._keep_alive, name="trainyard-api-workers", daemon=True)
        self._watch.start()

    def _keep_alive(self) -> None:
        while not self._stopping.wait(1.0):
            for i, proc in enumerate(self.procs):
                # exit code 0 is a clean stop (Ctrl-C reaches the whole process group): not restarted
                if not proc.is_alive() and proc.exitcode not in (0, None) and not self._stopping.is_set():
                    log.warning("API worker %d (pid %s) died with exit code %s; starting another",
                                i, proc.pid, proc.exitcode)
                    self.shared.worker_up(-1)  # it could not count itself out
                    self.procs[i] = self._spawn()

    def stop(self) -> None:
        self._stopping.set()
        for proc in self.procs:
            if proc.is_alive():
                proc.terminate()  # SIGTERM: uvicorn finishes the requests in flight
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)


def api_worker_main(address: tuple[str, int], shared, options: dict, read_timeout_s: float) -> None:
    from api.http.app import create_app
    from service.settings import get_settings

    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    sock = listen(*address, reuse_port=True)
    run_uvicorn(create_app(get_settings(), shared, api_only=True), options, read_timeout_s, sockets=[sock])
