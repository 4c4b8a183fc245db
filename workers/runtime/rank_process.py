"""The built-in training loop of one rank, in a child process of its rank actor.

Why a child: the loop's process then holds only torch's and gloo's threads, not the ~27 of Ray's
core worker, and the loop's CPU can be told from the actor's (a per-process reading). Measured on a
2-core host (bench/notes/2026-12-05-ratio-chase.md, 2026-12-04), the move is worth at most ~1% of throughput: the gap to
torchrun there is the CPU the actors' core workers take (~1.2% of a core each), which a child does
not remove; once its loop is forked, the actor lowers its own priority instead (step_aside.py).
The child is forked from the actor once the actor has imported the training stack, so it starts
in milliseconds with torch imported, and writes to the actor's log file (its inherited stdout and
stderr). It never calls Ray; CUDA is first touched in the child; cached object-store
clients are made anew after a fork (workers/storage/location.py).

One duplex pipe joins them, carrying the messages below:
  actor -> child: Stop | Shares
  child -> actor: Ready (the setup's answer) | Relayed (a RankEvent) | Done (the loop's result) | Failed
The child exits when the actor's end of the pipe closes (the actor was killed, or its node lost),
and not before: its process group stays up as long as the actor does, as before the move.
When the child dies without a word (an injected crash, a signal), the actor exits with the child's
code, so the supervisor sees what it saw before the loop moved: the rank's process died.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import sys
import threading
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from workers.os_thread_name import name_os_thread
from workers.program.prestarted import switch
from workers.training.control import RankControl, UnevenShares

# On unless TRAINYARD_RANK_PROCESS=false in the workers' environment: then the loop runs in the actor's
# own process, as before (a switch to rule the child out, not a tuning).
IN_CHILD = switch("TRAINYARD_RANK_PROCESS", os.environ.get("TRAINYARD_RANK_PROCESS"), True)

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

    from workers.events import RankEvent
    from workers.spec import JobSpec
    from workers.storage import Storage


@dataclass(frozen=True)
class RankStart:
    """What the child needs to join its job's process group and build its Trainer."""

    spec: JobSpec
    rank: int
    world_size: int
    storage: Storage
    master_addr: str
    master_port: int
    timeout_s: float
    uneven: UnevenShares | None  # the supervisor's terms for the data split (workers/training/control.py)
    nodes: tuple[str, ...] = ()  # the node id of every rank (the placement's node map)
    # Joins a running job alone (an async parameter-server trainer): a process group of its own (rank 0 of
    # 1, at master_addr:master_port, its own), no checkpoint loaded.
    join: bool = False


@dataclass(frozen=True)
class Stop:
    pass


@dataclass(frozen=True)
class Shares:
    version: int
    shares: list[int]


@dataclass(frozen=True)
class Ready:
    answer: dict


@dataclass(frozen=True)
class Relayed:
    event: RankEvent


@dataclass(frozen=True)
class Done:
    result: dict


@dataclass(frozen=True)
class Failed:
    error: BaseException


def start_trainer(start: RankStart, emit: Callable[[RankEvent], None] | None = None):
    """In the child: the rank's device, process group and Trainer, resumed from the latest checkpoint.
    (trainer, the setup answer the supervisor reads). `emit`: where the set-up's progress goes (opening
    the data, building the model, loading the checkpoint), heard by the supervisor while it waits."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from workers.training.out_of_memory import is_out_of_memory, out_of_memory
    from workers.training.progress import ProgressReporter, report_interval_s
    from workers.training.trainer import Trainer

    spec = start.spec
    use_cuda = spec.resources.gpus_per_worker > 0 and torch.cuda.is_available()
    device = torch.device("cuda", 0) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    torch.set_num_threads(max(1, int(spec.resources.cpus_per_worker)))
    torch.use_deterministic_algorithms(True, warn_only=True)
    print(f"[rank {start.rank}] joining {start.master_addr}:{start.master_port} "
          f"({'nccl' if use_cuda else 'gloo'}, world {start.world_size}; loop in process {os.getpid()})", flush=True)
    dist.init_process_group(
        "nccl" if use_cuda else "gloo", init_method=f"tcp://{start.master_addr}:{start.master_port}",
        rank=0 if start.join else start.rank, world_size=1 if start.join else start.world_size,
        timeout=timedelta(seconds=start.timeout_s),
    )
    if spec.train.compile:  # before anything compiles: a restarted rank on this node finds the job's cache
        from workers.parallel.compiled_blocks import use_compile_cache

        use_compile_cache(str(start.storage))
    reporter = ProgressReporter(start.rank, report_interval_s(spec.fault_tolerance.hang_timeout_s), emit)
    try:
        trainer = Trainer(spec, start.rank, start.world_size, device, start.storage, start.uneven, reporter,
                          nodes=start.nodes, joining=start.join)
        step = trainer.join_running() if start.join else trainer.resume_from_latest()
    except Exception as exc:
        if is_out_of_memory(exc):  # building or loading the model: no restart would fit it either
            last = reporter.last
            raise out_of_memory(exc, start.rank, last.describe() if last else "set-up", device) from exc
        raise
    print(f"[rank {start.rank}] ready at step {step}", flush=True)
    return trainer, {"rank": start.rank, "start_step": step, "device": str(device), "loop_pid": os.getpid()}


class RankProcess:
    """The actor's handle on its child: `ready()` after setup, then `run()` as a Trainer's."""

    def __init__(self, start: RankStart) -> None:
        context = multiprocessing.get_context("fork")
        self._conn, child_end = context.Pipe(duplex=True)
        gc.freeze()  # the child must never collect (and so finalise) the actor's Ray objects
        self._process = context.Process(target=_child_main, args=(child_end, self._conn, start),
                                        name=f"rank-{start.rank}")
        self._process.start()
        gc.unfreeze()
        child_end.close()
        self._send_lock = threading.Lock()

    def ready(self, emit: Callable[[RankEvent], None] | None = None) -> dict:
        """The setup answer, or the setup's own exception raised here (a configuration error stays one).
        The set-up's progress on the way goes to `emit`."""
        message = self._receive()
        while isinstance(message, Relayed):
            if emit is not None:
                emit(message.event)
            message = self._receive()
        if isinstance(message, Ready):
            return message.answer
        assert isinstance(message, Failed), message
        raise message.error

    def run(self, emit: Callable[[RankEvent], None], control: RankControl) -> dict:
        """Relays the child's events to `emit` until its loop returns (its result) or raises (raised here).
        Requests already on `control` are passed on first; later ones come through request_*."""
        if control.stop_event.is_set():
            self.request_stop()
        pending = control.pending_shares()
        if pending is not None:
            self.request_shares(*pending)
        while True:
            message = self._receive()
            if isinstance(message, Relayed):
                emit(message.event)
            elif isinstance(message, Done):
                return message.result
            else:
                assert isinstance(message, Failed), message
                raise message.error

    def request_stop(self) -> None:
        self._send(Stop())

    def request_shares(self, version: int, shares: list[int]) -> None:
        self._send(Shares(version, list(shares)))

    def terminate(self) -> None:
        """Before the actor is killed: the child goes first (it would also go when the actor does)."""
        if self._process.pid is not None and self._process.exitcode is None:
            self._process.kill()

    def _send(self, message: Stop | Shares) -> None:
        with self._send_lock:
            try:
                self._conn.send(message)
            except (BrokenPipeError, ConnectionResetError, OSError):
                pass  # the child has ended: _receive reports how

    def _receive(self) -> Ready | Relayed | Done | Failed:
        try:
            return self._conn.recv()
        except (EOFError, ConnectionResetError, OSError):
            self._process.join()
            code = self._process.exitcode
            print(f"[rank process] the training process {self._process.pid} ended without a result "
                  f"(exit code {code}): this actor ends with it", flush=True)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code if code and code > 0 else 1)


def _child_main(conn: Connection, actor_end: Connection, start: RankStart) -> None:
    actor_end.close()  # forked with both ends: only the actor may hold its end, or its death is never seen
    for stream in (sys.stdout, sys.stderr):  # whole lines reach the rank's log even if this process is killed
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(line_buffering=True)
    send_lock = threading.Lock()

    def send(message: Ready | Relayed | Done | Failed) -> None:
        with send_lock:
            conn.send(message)

    control = RankControl()
    # Started first: from here on the actor's going ends this process, whatever the loop is doing.
    threading.Thread(target=_listen, args=(conn, control), daemon=True, name="rank-requests").start()
    try:
        trainer, answer = start_trainer(start, lambda event: send(Relayed(event)))
        send(Ready(answer))
        send(Done(trainer.run(lambda event: send(Relayed(event)), control)))
    except BaseException as exc:
        traceback.print_exc()
        send(Failed(_portable(exc)))
    # The process group stays up until the actor goes (teardown kills it), as when the loop ran in the
    # actor: a peer still in its last collective is not cut off by this rank's leaving first.
    threading.Event().wait()


def _listen(conn: Connection, control: RankControl) -> None:
    """The actor's requests, applied to the loop's RankControl; the actor gone ends this process."""
    name_os_thread("rank-requests")  # told apart from the loop's threads (bench/overhead.py)
    while True:
        try:
            message = conn.recv()
        except (EOFError, ConnectionResetError, OSError):
            _end(1)
        if isinstance(message, Stop):
            control.request_stop()
        elif isinstance(message, Shares):
            control.request_shares(message.version, message.shares)


def _portable(exc: BaseException) -> BaseException:
    """The exception itself where it survives pickling (its type decides a restart), else its text."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _end(code: int) -> None:
    """Leave without Python's shutdown: no destructor of a process group joins gloo's threads here."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
