"""Counts runs in which a command rank does not exit: pre-started Pythons against new processes.

    .venv/bin/python bench/prestarted_exit_loop.py [RUNS] [--new-processes [--dynamo-first | --first MODULE]]
    (4-9 s a run here)

(py-spy comes with the bench extra: `.venv/bin/pip install -e '.[bench]'`.)

Each run launches examples/torchrun-script/train.py (30 steps) on 2 ranks that meet at a TCP store this
process hosts, as a warm rank 0 actor does (TORCHELASTIC_USE_AGENT_STORE=True). The ranks start either in
pre-started Pythons (workers/program/prestarted.py) or, with --new-processes, as `python train.py`
(with --dynamo-first, a sitecustomize imports torch._dynamo before the script runs; --first MODULE another
module). In both modes the next
run's two pre-started Pythons import torch while the run trains (as a warm pool refills), so the only
difference is how the ranks started. A rank still alive 60 s after the launch is dumped with py-spy
(--native) and killed; that run's directory (logs, checkpoints) is kept and named, the others' are removed.

The fault it counts is torch's (bench/notes/programs-bench.md, "A program that did not end"): when main() returns,
DDP's Reducer frees the process group holding the GIL and joins gloo's worker thread, which is freeing a
finished collective that holds a tensor with a Python object, and waits for the GIL. Measured here
(torch 2.13) only when torch._dynamo, or DCP and FSDP, were imported before the script's
init_process_group, and no longer in the pre-started Python, which ends without destroying process
groups (the table in docs/programs.md).
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from torch.distributed import TCPStore  # noqa: E402

from workers.program.prestarted import Launch, PrestartedPython  # noqa: E402

SCRIPT = Path(__file__).resolve().parent.parent / "examples" / "torchrun-script" / "train.py"
COMMAND = ["python", str(SCRIPT), "--steps", "30", "--checkpoint-every", "10"]
new_processes = "--new-processes" in sys.argv
site = Path(tempfile.mkdtemp())
first = sys.argv[sys.argv.index("--first") + 1] if "--first" in sys.argv else None
if "--dynamo-first" in sys.argv:
    first = "torch._dynamo"
if first:
    (site / "sitecustomize.py").write_text(f"import {first}\n")
numbers = [a for a in sys.argv[1:] if not a.startswith("--") and a != first]
runs = int(numbers[0]) if numbers else 20
hangs = 0
pres = [PrestartedPython() for _ in range(2)]
for i in range(runs):
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(minutes=5))
    cwd = Path(tempfile.mkdtemp())
    procs = []
    for r in range(2):
        env = {**os.environ, "RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(store.port), "TORCHELASTIC_USE_AGENT_STORE": "True", "PYTHONUNBUFFERED": "1",
               "PATH": os.path.dirname(sys.executable) + ":" + os.environ["PATH"]}
        if new_processes:
            env["PYTHONPATH"] = str(site)
            with open(cwd / f"r{r}.log", "ab") as log:
                procs.append(subprocess.Popen(COMMAND, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True))
        else:
            plan = pres[r].plan(COMMAND, env)
            assert isinstance(plan, Launch), plan
            procs.append(pres[r].launch(plan, cwd, env, cwd / f"r{r}.log"))
    for p in pres:
        p.close()  # unused in --new-processes mode; launched ones are already handed over
    pres = [PrestartedPython() for _ in range(2)]  # the next run's, importing while this one runs
    t, hung_here = time.time(), False
    for r, p in enumerate(procs):
        try:
            p.wait(timeout=max(1, 60 - (time.time() - t)))
        except subprocess.TimeoutExpired:
            hangs += 1
            hung_here = True
            print(f"run {i} rank {r} HUNG (pid {p.pid}; logs in {cwd})", flush=True)
            subprocess.run([str(Path(sys.executable).with_name("py-spy")), "dump", "--native", "--pid", str(p.pid)])
            p.kill()
        else:
            if p.returncode != 0:
                print(f"run {i} rank {r} exited {p.returncode}: {(cwd / f'r{r}.log').read_text()[-2000:]}")
    del store
    if not hung_here:
        shutil.rmtree(cwd)
for p in pres:
    p.close()
shutil.rmtree(site)
mode = "pre-started Pythons" if not new_processes else "new processes" + (
    f", {first} imported first" if first else "")
print(f"{mode}: {hangs} hangs in {runs} runs", flush=True)
