"""Reproduces a known fault: a command rank in a pre-started Python sometimes does not exit.

    .venv/bin/python bench/prestarted_exit_loop.py [RUNS]      (about 9 s per run here)

Each run launches examples/torchrun-script/train.py (30 steps) on 2 ranks in pre-started Pythons
(workers/program/prestarted.py) that meet at a TCP store this process hosts, as a warm rank 0 actor
does (TORCHELASTIC_USE_AGENT_STORE=True). A rank still alive 60 s after the launch is dumped with
py-spy and killed. Measured 2026-12-03: 1 of 20 runs, rank 1, idle in train.py's last line (the
call of main(), i.e. in the destructors of main()'s locals after destroy_process_group), with one
other thread. The same loop with new processes instead (bench: agent store, `python train.py`)
hung 0 of 25 times. Cause not found yet (docs/programs-bench.md, "A program that did not end").
"""

import os
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
runs = int(sys.argv[1]) if len(sys.argv) > 1 else 20
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
        plan = pres[r].plan(["python", str(SCRIPT), "--steps", "30", "--checkpoint-every", "10"], env)
        assert isinstance(plan, Launch), plan
        procs.append(pres[r].launch(plan, cwd, env, cwd / f"r{r}.log"))
    pres = [PrestartedPython() for _ in range(2)]  # the next run's, importing while this one runs (as a pool refills)
    t = time.time()
    for r, p in enumerate(procs):
        try:
            p.wait(timeout=max(1, 60 - (time.time() - t)))
        except subprocess.TimeoutExpired:
            hangs += 1
            print(f"run {i} rank {r} HUNG (pid {p.pid})", flush=True)
            subprocess.run([str(Path(sys.executable).with_name("py-spy")), "dump", "--pid", str(p.pid)])
            p.kill()
    del store
for p in pres:
    p.close()
print("prestarted+agent hangs", hangs, "of", runs)
