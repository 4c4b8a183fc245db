"""`train.compile` against plain loops of the same model and data (issue 49), on 1 and 2 workers:

- Trainyard with `train.compile: true` (each block compiled in place, DDP over the workers);
- a plain eager torchrun loop (bench/torchrun_ddp.py);
- the same torchrun loop compiling each block the same way (`train.compile` in the spec it reads).

    .venv/bin/python bench/compile.py [--steps 30] [--workers 1 2]

Samples/s is steady state (the first 20% of steps left out, as JobRun's summary does), its ratio is to
the eager torchrun loop of the same worker count, and the first step's time (compile included, each run
with a cold compile cache of its own) has its own column. One run per cell: on a shared host, noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.ddp_runners import make_spec, run_torchrun, run_trainyard, start_ray  # noqa: E402
from bench.table import print_markdown_table  # noqa: E402


def spec_for(steps: int, workers: int, compiled: bool):
    from workers.spec import JobSpec

    data = make_spec(steps, "bench-compile").model_dump(mode="json", exclude_unset=True)
    data["parallel"] = {"dp": workers}
    data["resources"] = {**data["resources"], "workers": workers}
    data["train"] = {**data["train"], "compile": compiled}
    return JobSpec.model_validate(data)


def measure(steps: int, workers: int, work: Path) -> list[tuple[str, dict]]:
    rows = []
    for label, compiled in (("torchrun eager loop", False), ("torchrun compiled loop", True)):
        spec = spec_for(steps, workers, compiled)
        spec_file = work / f"spec-{workers}-{compiled}.json"
        spec_file.write_text(json.dumps(spec.model_dump(mode="json")))
        cache = work / f"inductor-{workers}-{compiled}"  # a cold cache for this run alone
        rows.append((label, run_torchrun(spec, spec_file, work, f"torchrun-{workers}-{compiled}", nproc=workers,
                                         env_extra={"TORCHINDUCTOR_CACHE_DIR": str(cache)})))
    from workers.parallel.compiled_blocks import compile_cache_dir
    from workers.storage import Storage

    job_dir = work / f"trainyard-{workers}"
    shutil.rmtree(compile_cache_dir(Storage.at(job_dir).uri), ignore_errors=True)
    rows.insert(0, ("Trainyard, compile: true",
                    run_trainyard(spec_for(steps, workers, True), work, f"trainyard-{workers}")))
    shutil.rmtree(compile_cache_dir(Storage.at(job_dir).uri), ignore_errors=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--num-cpus", type=int, default=8, help="logical CPUs of the local Ray")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=FutureWarning)
    start_ray(args.num_cpus)
    work = Path(tempfile.mkdtemp(prefix="trainyard-bench-compile-"))
    body = []
    try:
        for workers in args.workers:
            rows = measure(args.steps, workers, work)
            eager = dict(rows)["torchrun eager loop"]["sps"]
            for label, r in rows:
                body.append([label, str(workers), f"{r['sps']:.1f}", f"{r['sps'] / eager:.2f}",
                             f"{r['step_time_s'][0]:.1f}", f"{r['final_loss']:.4f}"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"GPT 2 x d128, seq 64, global batch 32, {args.steps} steps; load average {os.getloadavg()}")
    print_markdown_table(("system", "workers", "samples/s", "x eager loop", "first step s", "final loss"), body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
