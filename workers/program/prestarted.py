"""A rank actor's pre-started Python (workers/program/prestart.py): started with the actor, taken by a
`command` program that this interpreter can run unchanged, so the program's process has already
imported torch when the job asks for it (seconds of a cold start, off the time to the first step).

It is used only when the result is the same as a new `python` process's:
  - the command is this environment's `python` (the one a new process would find first on the
    rank's PATH) with a script, or `-m module`, and at most the options `-u` (the rank is unbuffered
    anyway) before them;
  - the variables read while Python and torch start (PYTHON*, OMP_*, MKL_*, LD_*, TORCH_*, ...)
    are the same in the rank's environment as in the pre-started one's.
Otherwise the rank starts a new process, and its log says why.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# Read by the interpreter, the allocator, OpenMP or torch while they start: fixed once the process runs.
START_TIME_PREFIXES = ("PYTHON", "OMP_", "MKL_", "KMP_", "GOMP_", "OPENBLAS_", "LD_", "MALLOC_", "TORCH_",
                       "PYTORCH_")


def switch(name: str, value: str | None, default: bool) -> bool:
    """A boolean environment switch, spelled as the service's boolean settings are (true/false, 1/0,
    yes/no, on/off); anything else is refused, naming the variable, rather than read as either."""
    if value is None or value.strip() == "":
        return default
    word = value.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{name}={value!r}: must be one of true/false, 1/0, yes/no, on/off")


# On unless TRAINYARD_PRESTART_PYTHON=false in the workers' environment (a switch to rule it out, not a tuning).
ENABLED = switch("TRAINYARD_PRESTART_PYTHON", os.environ.get("TRAINYARD_PRESTART_PYTHON"), True)
READY_TIMEOUT_S = 120.0  # a pre-started Python still importing torch is waited for: it is ahead of a new one
_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)  # resolved before any fork: the child only makes the call


def die_with_parent() -> None:
    """In a child, before exec: if the rank's actor dies (ray.kill, a lost node), so does its program."""
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass(frozen=True)
class Launch:
    """How one command runs in the pre-started interpreter: what follows `python` on its command line."""

    args: list[str]


def launch_plan(command: list[str], env: dict[str, str], prestart_env: dict[str, str]) -> Launch | str:
    """The launch, or why this command needs a new process (a sentence for the rank's log)."""
    python = shutil.which(command[0], path=env.get("PATH"))
    if python is None or not _same_python(Path(python), Path(sys.executable)):
        return f"{command[0]!r} is not this environment's python ({sys.executable})"
    args = list(command[1:])
    while args and args[0] == "-u":
        args.pop(0)
    if not args:
        return "no script or module to run"
    if args[0].startswith("-") and (args[0] != "-m" or len(args) < 2):
        return f"python option {args[0]!r}"
    changed = sorted(k for k in set(env) | set(prestart_env) if k.startswith(START_TIME_PREFIXES)
                     and env.get(k) != prestart_env.get(k))
    if changed:
        return f"start-time variables differ from the pre-started Python's: {', '.join(changed)}"
    return Launch(args)


def _same_python(a: Path, b: Path) -> bool:
    """One interpreter in one environment: `python` and `python3` of a venv are two names of it; the
    base interpreter they link to is another environment (without the venv's packages)."""
    return a.absolute().parent == b.absolute().parent and a.resolve() == b.resolve()


class PrestartedPython:
    """One pre-started interpreter, spawned now (its torch import runs beside the actor's own work)."""

    def __init__(self) -> None:
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc: subprocess.Popen | None = subprocess.Popen(
            [sys.executable, "-m", "workers.program.prestart"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env=self.env, start_new_session=True, preexec_fn=die_with_parent)

    def plan(self, command: list[str], env: dict[str, str]) -> Launch | str:
        if self.proc is None or self.proc.poll() is not None:
            return "the pre-started Python is gone"
        return launch_plan(command, env, self.env)

    def launch(self, launch: Launch, cwd: Path, env: dict[str, str], log_path: Path) -> subprocess.Popen:
        """Hand the program to the interpreter: from here on it is the rank's program process."""
        proc, self.proc = self.proc, None
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        if not _ready(proc, READY_TIMEOUT_S):
            _kill(proc)
            raise OSError(f"the pre-started Python did not start within {READY_TIMEOUT_S:.0f} s")
        proc.stdin.write(json.dumps({"args": launch.args, "cwd": str(cwd), "env": env, "log": str(log_path)})
                         .encode() + b"\n")
        proc.stdin.close()
        proc.stdout.close()
        return proc

    def close(self) -> None:
        """Not needed (a job of another kind, or the actor is going): stop it."""
        proc, self.proc = self.proc, None
        if proc is not None:
            _kill(proc)


def _ready(proc: subprocess.Popen, timeout_s: float) -> bool:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        readable, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if readable:
            return proc.stdout.readline() == b"ready\n"
    return False


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
