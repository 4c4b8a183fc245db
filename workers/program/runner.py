"""One rank's program: a `command` run as a child process in its own process group, or a
`function` called in this actor with the process group initialised. Either has the same `run`
as Trainyard's own Trainer (workers/training/trainer.py), so the actor and the group treat both alike.
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import trainyard.session as session
from workers.events import RankEvent
from workers.program.checkpoint_watch import CheckpointWatch
from workers.program.environment import RankPlace, Rendezvous, checkpoint_dir, rank_environment
from workers.program.errors import ProgramFailed, ProgramUnfixable, exit_failure
from workers.program.prestarted import Launch, PrestartedPython, die_with_parent
from workers.program.reports import ReportSink
from workers.program.session_server import SessionServer
from workers.program.working_dir import materialize
from workers.spec import JobSpec
from workers.storage import Storage, local_dir
from workers.training.control import RankControl

KILL_AFTER_S = 5.0  # SIGTERM to SIGKILL, once the grace period (program.grace_period_s) is over


class ProgramRunner:
    def __init__(self, spec: JobSpec, place: RankPlace, job: Storage, attempt: int, master: Rendezvous,
                 log_path: Path, timeout_s: float, prestarted: PrestartedPython | None = None):
        assert spec.program is not None
        self.prestarted = prestarted
        self.spec, self.program, self.place, self.job = spec, spec.program, place, job
        self.attempt, self.master, self.log_path, self.timeout_s = attempt, master, log_path, timeout_s
        # Storage root = <root>/jobs/<id>: uploaded code lives in <root>/code/ (working_dir.py reads a local root).
        root = job.parent.parent
        self.workdir = materialize(self.program.working_dir, root) \
            or local_dir(job)
        self.workdir.mkdir(parents=True, exist_ok=True)
        if job.is_local:  # an object store has no directories to make
            checkpoint_dir(job).local_path.mkdir(parents=True, exist_ok=True)

    def run(self, emit: Callable[[RankEvent], None], control: RankControl) -> dict[str, Any]:
        watch = CheckpointWatch(checkpoint_dir(self.job), self.spec.checkpoint.keep, emit) \
            if self.place.rank == 0 else None
        sink = ReportSink(self.spec, self.place.rank, self.job, emit, control.stop_event, self.crash)
        try:
            self._run(sink, control.stop_event)
        finally:
            if watch is not None:
                watch.close()
        result: dict[str, Any] = {"exit_code": 0, "last_step": sink.last_step}
        if control.stop_event.is_set():
            result["stopped_at"] = sink.last_step  # asked to stop, and it did: cancel or preemption
        return result

    def _run(self, sink: ReportSink, stop: threading.Event) -> None:
        raise NotImplementedError

    def crash(self) -> None:
        raise NotImplementedError

    def terminate(self) -> None:
        """Stop the program now (the group is being torn down)."""


class CommandRunner(ProgramRunner):
    proc: subprocess.Popen | None = None

    def _run(self, sink: ReportSink, stop: threading.Event) -> None:
        assert self.program.command is not None
        server = SessionServer(sink, stop)
        env = {**os.environ, **rank_environment(self.spec, self.job, self.place, self.master, self.attempt,
                                                server.path)}
        # `python` in a command is this environment's (as under torchrun in the same venv).
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        try:
            self.proc, how = self._start(env)
        except (FileNotFoundError, PermissionError) as exc:
            server.close()
            raise ProgramUnfixable(f"rank {self.place.rank}: program.command {self.program.command[0]!r} "
                                   f"cannot run: {exc.strerror}") from exc
        print(f"[rank {self.place.rank}] started {self.program.command} (pid {self.proc.pid}, {how}) "
              f"in {self.workdir}", flush=True)
        try:
            code = self.proc.wait()
            exited_at = time.time()  # before the session drains: the peers' ends are seen as promptly
        finally:
            server.close()
        if code != 0:
            raise exit_failure(self.place.rank, self.program.command[0], code, _tail(self.log_path), exited_at)

    def _start(self, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
        """The program's process: the actor's pre-started Python where it runs this command as a new one
        would (workers/program/prestarted.py), else a new process; and which, for the log."""
        assert self.program.command is not None
        plan = self.prestarted.plan(self.program.command, env) if self.prestarted else "none was started"
        if isinstance(plan, Launch):
            assert self.prestarted is not None
            try:
                return self.prestarted.launch(plan, self.workdir, env, self.log_path), "pre-started Python"
            except OSError as exc:
                plan = str(exc)
        if self.prestarted is not None:
            self.prestarted.close()
        proc = subprocess.Popen(self.program.command, cwd=self.workdir, env=env, start_new_session=True,
                                preexec_fn=die_with_parent)
        return proc, f"new process: {plan}"

    def crash(self) -> None:
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGKILL)

    def terminate(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=KILL_AFTER_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class FunctionRunner(ProgramRunner):
    def _run(self, sink: ReportSink, stop: threading.Event) -> None:
        import torch
        import torch.distributed as dist

        assert self.program.function is not None
        env = rank_environment(self.spec, self.job, self.place, self.master, self.attempt, None)
        env.pop("CUDA_VISIBLE_DEVICES", None)  # this process keeps the GPUs Ray gave it (cuda:0 first), as in Ray Train
        os.environ.update(env)
        use_cuda = self.spec.resources.gpus_per_worker > 0 and torch.cuda.is_available()
        if use_cuda:
            torch.cuda.set_device(0)
        fn = _import(self.program.function, self.workdir, self.place.rank)
        dist.init_process_group("nccl" if use_cuda else "gloo", init_method=f"tcp://{self.master.addr}:{self.master.port}",
                                rank=self.place.rank, world_size=self.place.world_size,
                                timeout=timedelta(seconds=self.timeout_s))
        session.bind(_InProcess(sink, stop))
        try:
            fn(dict(self.program.config))
        except ProgramFailed:
            raise
        except Exception as exc:
            raise ProgramFailed(f"rank {self.place.rank}: {self.program.function} raised "
                                f"{type(exc).__name__}: {exc}") from exc
        finally:
            session.bind(None)
            if dist.is_initialized():
                dist.destroy_process_group()

    def crash(self) -> None:
        os._exit(17)  # the rank's process dies, as a crashed node's would


class _InProcess:
    def __init__(self, sink: ReportSink, stop: threading.Event):
        self.sink, self.stop = sink, stop

    def report(self, metrics: dict[str, float], step: int | None) -> None:
        self.sink.report(metrics, step)

    def should_stop(self) -> bool:
        return self.stop.is_set()


def program_runner(spec: JobSpec, place: RankPlace, job: Storage, attempt: int, master: Rendezvous,
                   log_path: Path, timeout_s: float, prestarted: PrestartedPython | None = None) -> ProgramRunner:
    assert spec.program is not None
    kind = CommandRunner if spec.program.command is not None else FunctionRunner
    return kind(spec, place, job, attempt, master, log_path, timeout_s, prestarted)


def _import(target: str, workdir: Path, rank: int) -> Callable[[dict], Any]:
    module_name, name = target.split(":")
    if str(workdir) not in sys.path:
        sys.path.insert(0, str(workdir))
    try:
        module = importlib.import_module(module_name)
        return getattr(module, name)
    except (ImportError, AttributeError, SyntaxError) as exc:
        raise ProgramUnfixable(f"rank {rank}: program.function {target!r} cannot be loaded: "
                               f"{type(exc).__name__}: {exc}") from exc


def _tail(path: Path, lines: int = 20, max_bytes: int = 16384) -> list[str]:
    """The last lines of the rank's log, read from its end."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            return f.read().decode(errors="replace").splitlines()[-lines:]
    except OSError:
        return []
