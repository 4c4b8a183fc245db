"""A pre-started Python for one `python script.py` / `python -m module` rank: the process's entry point.

`python -m workers.program.prestart` imports torch and the torch modules a training script's start
imports (DDP, FSDP, DCP, and torch._dynamo, which DDP's constructor imports), says `ready` on stdout
and waits for one launch on stdin: a JSON line with the command's argv after `python`, its working
directory, its whole environment and the rank's log file. It then becomes that program, as `python`
would have run it: environment, working directory, sys.argv, sys.path[0], stdin from /dev/null,
stdout and stderr appended to the log, the script or module run as a new `__main__`, and its exit
code (SystemExit, or 1 with a traceback) as the process's. It ends as Python's shutdown does (threads,
atexit, flush) but without destroying process groups on the way out (_keep_destroyed_groups, _end).
The actor side (what may launch here, and how) is workers/program/prestarted.py.

Only the standard library and torch's modules stay loaded for the program: it finds nothing of
Trainyard's in sys.modules that it did not import itself.
"""

import atexit
import ctypes
import functools
import json
import os
import runpy
import signal
import sys
import threading
import types


def _become(launch: dict) -> None:
    os.environ.clear()
    os.environ.update(launch["env"])
    os.chdir(launch["cwd"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    log = os.open(launch["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)


def main() -> None:
    # The point of starting early: what a training script's start imports. DDP's constructor alone imports
    # torch._dynamo (0.6-1.2 s here). CUDA is not initialised: devices are chosen after the launch.
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401
    import torch.distributed.checkpoint  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    import torch.nn.parallel  # noqa: F401
    _keep_destroyed_groups()

    print("ready", flush=True)
    line = sys.stdin.readline()
    if not line:  # closed unused: its actor went, or the job was of another kind
        return
    launch = json.loads(line)
    _become(launch)
    args: list[str] = launch["args"]
    sys.modules["__main__"] = types.ModuleType("__main__")  # the program's own, not this file's namespace
    for name in [m for m in sys.modules if m.split(".")[0] == "workers"]:
        del sys.modules[name]  # `-m` imported this file's packages: a program's own `workers` must import
    try:
        _run(args)
    except SystemExit as done:
        _end(_exit_code(done.code))
    except KeyboardInterrupt:
        _end(None)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        _end(1)
    _end(0)


def _run(args: list[str]) -> None:
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        sys.path[0] = os.getcwd()
        runpy._run_module_as_main(args[1])  # type: ignore[attr-defined]  # what `python -m` itself calls
    elif not os.path.isfile(args[0]):
        sys.stderr.write(f"{sys.executable}: can't open file {os.path.abspath(args[0])!r}: "
                         f"[Errno 2] No such file or directory\n")  # python's words and exit code
        sys.exit(2)
    else:
        sys.argv = list(args)
        sys.path[0] = os.path.dirname(os.path.realpath(args[0]))
        runpy.run_path(args[0], run_name="__main__")


KEPT_GROUPS: list = []


def _keep_destroyed_groups() -> None:
    """A process group the program destroys stays referenced until the process ends, so that no
    ProcessGroupGloo destructor runs while the main thread holds the GIL (when DDP's Reducer drops the
    last reference as main() returns, or as the interpreter tears modules down). In torch 2.13 that
    destructor joins gloo's worker thread, which may still be freeing a finished collective whose tensor
    has a Python object and waits for the GIL: a deadlock (docs/programs.md, bench/prestarted_exit_loop.py)."""
    import torch.distributed.distributed_c10d as c10d

    destroy = c10d.destroy_process_group

    def destroy_process_group(group=None):
        world = c10d._world  # the groups the call is about to forget
        KEPT_GROUPS.extend([group] if group is not None else [*world.pg_map, world.default_pg])
        return destroy(group)

    functools.update_wrapper(destroy_process_group, destroy)
    c10d.destroy_process_group = destroy_process_group
    setattr(sys.modules["torch.distributed"], "destroy_process_group", destroy_process_group)


def _exit_code(code: object) -> int:
    """What `python` makes of SystemExit's argument: None is 0, an int itself, anything else is printed."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(f"{code}\n")
    return 1


def _end(code: int | None) -> None:
    """End as Python's own shutdown does (wait for non-daemon threads, atexit handlers, flush) but without
    tearing the modules down: no process group is destroyed on the way out (_keep_destroyed_groups).
    `code` None: an uncaught KeyboardInterrupt, which ends the process by SIGINT as python does."""
    threading._shutdown()  # type: ignore[attr-defined]  # what Py_FinalizeEx calls first
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    ctypes.CDLL(None).fflush(None)  # C and C++ output still buffered in this process
    if code is None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit((code or 0) & 0xFF)


if __name__ == "__main__":
    main()
