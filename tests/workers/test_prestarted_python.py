"""A command program in its actor's pre-started Python (workers/program/prestarted.py) sees what a new
`python` process sees: the same argv, sys.path[0], working directory, environment, `__main__`, output
and exit codes; commands it cannot run the same way are named, with the reason, for a new process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from workers.program.prestarted import Launch, PrestartedPython, launch_plan, switch

PROBE = '''
import json, os, sys


def ours():
    """Trainyard's modules the program finds loaded: none (the pre-started Python imports only torch's)."""
    return sorted(m for m in sys.modules if m.split(".")[0] in ("workers", "service", "trainyard", "deploy"))


def torch_imported():
    if not os.environ.get("PROBE_TORCH"):
        return None
    import torch
    return torch.__version__


if len(sys.argv) > 1 and sys.argv[1] == "fail":
    raise ValueError("the probe failed")
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(), "name": __name__,
                  "env": os.environ.get("PROBE_VALUE"), "rank": os.environ.get("RANK"),
                  "stdin": sys.stdin.read(), "torch": torch_imported(), "ours": ours()}))
sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
'''


@pytest.fixture()
def code(tmp_path: Path) -> Path:
    (tmp_path / "code" / "pkg").mkdir(parents=True)
    (tmp_path / "code" / "probe.py").write_text(PROBE)
    (tmp_path / "code" / "pkg" / "__init__.py").write_text("")
    (tmp_path / "code" / "pkg" / "probe.py").write_text(PROBE)
    return tmp_path / "code"


def rank_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "RANK": "1", "PROBE_VALUE": "x y", **extra}
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    return env


def run_new(command: list[str], cwd: Path, env: dict[str, str], log: Path) -> int:
    with open(log, "ab") as out:
        return subprocess.run(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out).returncode


def run_prestarted(command: list[str], cwd: Path, env: dict[str, str], log: Path) -> int:
    pre = PrestartedPython()
    plan = pre.plan(command, env)
    assert isinstance(plan, Launch), plan
    return pre.launch(plan, cwd, env, log).wait(timeout=120)


@pytest.mark.parametrize("command", [["python", "probe.py", "--a", "1"], ["python", "-u", "-m", "pkg.probe", "b"],
                                     [sys.executable, "probe.py"]], ids=["script", "module", "absolute"])
def test_a_program_sees_what_a_new_python_sees(code, tmp_path, command):
    env = rank_env(PROBE_TORCH="1")
    runs = {}
    for how, run in (("new", run_new), ("prestarted", run_prestarted)):
        log = tmp_path / f"{how}.log"
        log.write_text("earlier lines\n")  # the rank's log is appended to
        assert run(command, code, env, log) == 0, log.read_text()
        lines = log.read_text().splitlines()
        assert lines[0] == "earlier lines"
        runs[how] = json.loads(lines[-1])
    assert runs["prestarted"] == runs["new"]
    assert runs["new"]["torch"] and runs["new"]["ours"] == []
    assert runs["new"]["name"] == "__main__" and runs["new"]["env"] == "x y" and runs["new"]["rank"] == "1"


def test_exit_codes_and_errors_are_a_new_pythons(code, tmp_path):
    cases = [(["python", "probe.py"], {"PROBE_EXIT": "3"}, 3, None),
             (["python", "probe.py", "fail"], {}, 1, "ValueError: the probe failed"),
             (["python", "missing.py"], {}, 2, "can't open file"),
             (["python", "-m", "pkg.missing"], {}, 1, "No module named pkg.missing")]
    for command, extra, code_expected, text in cases:
        for how, run in (("new", run_new), ("prestarted", run_prestarted)):
            log = tmp_path / f"{how}-{command[-1]}.log"
            assert run(command, code, rank_env(**extra), log) == code_expected, (how, command, log.read_text())
            if text:
                assert text in log.read_text(), (how, command, log.read_text())


def test_commands_it_cannot_run_alike_start_a_new_process():
    env = rank_env()
    assert launch_plan(["python", "t.py", "-x"], env, env) == Launch(["t.py", "-x"])
    assert launch_plan(["python", "-u", "-m", "m"], env, env) == Launch(["-m", "m"])
    other_name = next(n for n in ("python3", "python") if Path(sys.executable).with_name(n).exists()
                      and Path(sys.executable).with_name(n).resolve() == Path(sys.executable).resolve()
                      and n != Path(sys.executable).name)
    assert launch_plan([other_name, "t.py"], env, env) == Launch(["t.py"])  # python3 and python of one venv
    for command, reason in ((["bash", "run.sh"], "is not this environment's python"),
                            (["/usr/bin/env", "python", "t.py"], "is not this environment's python"),
                            (["python", "-O", "t.py"], "python option '-O'"),
                            (["python", "-c", "print(1)"], "python option '-c'"),
                            (["python", "-m"], "python option '-m'"),
                            (["python"], "no script or module")):
        plan = launch_plan(command, env, env)
        assert isinstance(plan, str) and reason in plan, (command, plan)
    threads = launch_plan(["python", "t.py"], {**env, "OMP_NUM_THREADS": "7"}, env)
    assert isinstance(threads, str) and "OMP_NUM_THREADS" in threads
    path = launch_plan(["python", "t.py"], {**env, "PYTHONPATH": "/elsewhere"}, env)
    assert isinstance(path, str) and "PYTHONPATH" in path


def test_a_closed_prestarted_python_is_gone_and_says_so():
    pre = PrestartedPython()
    proc = pre.proc
    pre.close()
    assert proc is not None and proc.poll() is not None
    assert pre.plan(["python", "t.py"], rank_env()) == "the pre-started Python is gone"


def test_the_switch_reads_the_services_boolean_spellings_and_refuses_others():
    name = "TRAINYARD_PRESTART_PYTHON"
    assert [switch(name, v, True) for v in (None, "", "1", "true", "Yes", "ON")] == [True] * 6
    assert [switch(name, v, True) for v in ("0", "false", "FALSE", "no", "off")] == [False] * 5
    with pytest.raises(ValueError, match="TRAINYARD_PRESTART_PYTHON='nope': must be one of"):
        switch(name, "nope", True)


ENDINGS = '''
import atexit, os, sys, threading, time
import torch
import torch.distributed as dist

atexit.register(lambda: print("atexit ran"))
mode = sys.argv[1]
if mode == "thread":
    threading.Thread(target=lambda: (time.sleep(0.5), print("thread finished", flush=True))).start()
elif mode == "message":
    sys.exit("bad config")
elif mode == "interrupt":
    raise KeyboardInterrupt
elif mode == "group":
    dist.init_process_group("gloo", init_method="file://" + os.path.join(os.getcwd(), "store-" + sys.argv[2]),
                            rank=0, world_size=1)
    t = torch.ones(2)
    dist.all_reduce(t)
    dist.destroy_process_group()
    print("group", t.tolist(), dist.is_initialized(), flush=True)
sys.stdout.write("unflushed at the end")
'''


@pytest.mark.parametrize("mode,code_expected", [("thread", 0), ("message", 1), ("interrupt", -2), ("group", 0)])
def test_a_program_ends_as_in_a_new_python(tmp_path, mode, code_expected):
    """The pre-started Python ends without tearing its modules down (workers/program/prestart.py, _end): it still
    waits for the program's threads, runs its atexit handlers, flushes its output and keeps its exit code."""
    (tmp_path / "endings.py").write_text(ENDINGS)
    outputs = {}
    for how, run in (("new", run_new), ("prestarted", run_prestarted)):
        log = tmp_path / f"{how}.log"
        code = run(["python", "endings.py", mode, how], tmp_path, rank_env(), log)
        assert code == code_expected, (how, code, log.read_text())
        outputs[how] = [line for line in log.read_text().splitlines() if "Traceback" not in line]
    assert outputs["new"][-1].endswith("atexit ran") and outputs["prestarted"][-1] == outputs["new"][-1]
    if mode != "interrupt":  # the traceback's frames differ (runpy's), its last line does not
        assert outputs["prestarted"] == outputs["new"], outputs
