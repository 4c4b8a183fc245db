"""A pre-started Python for one `python script.py` / `python -m module` rank: the process's entry point.

`python -m workers.program.prestart` imports torch (the bulk of a training script's start), says
`ready` on stdout and waits for one launch on stdin: a JSON line with the command's argv after
`python`, its working directory, its whole environment and the rank's log file. It then becomes
that program, as `python` would have run it: environment, working directory, sys.argv, sys.path[0],
stdin from /dev/null, stdout and stderr appended to the log, the script or module run as a
new `__main__`, and its exit code (SystemExit, or 1 with a traceback) as the process's.
The actor side (what may launch here, and how) is workers/program/prestarted.py.

Only the standard library and what `import torch` imports are loaded before the launch, so the program
finds nothing of Trainyard's in sys.modules that it did not import itself.
"""

import json
import os
import runpy
import sys
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
    # The point of starting early: `import torch`, the bulk of a training script's start. Nothing more: with
    # torch._dynamo, or DCP and FSDP (which import DTensor), imported before a DDP program's init_process_group,
    # torch 2.13 can deadlock as the program ends (bench/prestarted_exit_loop.py, docs/programs.md).
    # CUDA is not initialised: devices are chosen after the launch.
    import torch  # noqa: F401

    print("ready", flush=True)
    line = sys.stdin.readline()
    if not line:  # closed unused: its actor went, or the job was of another kind
        return
    launch = json.loads(line)
    _become(launch)
    args: list[str] = launch["args"]
    sys.modules["__main__"] = types.ModuleType("__main__")  # the program's own, not this file's namespace
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


if __name__ == "__main__":
    main()
