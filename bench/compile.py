"""`train.compile` against plain loops of the same model and data (issue 49), on 1 and 2 workers, for the
built-in GPT and a Hugging Face Llama:

- Trainyard with `train.compile: true` (each block compiled in place, DDP over the workers);
- a plain eager torchrun loop (bench/torchrun_ddp.py);
- the same torchrun loop compiling each block the same way (`train.compile` in the spec it reads);
- Ray Train running the eager loop.

    .venv/bin/python bench/compile.py [--steps 30] [--workers 1 2] [--models gpt llama]

Beside each model, its compile ceiling (bench/compile_ceiling.py): the most compiling the blocks could
speed up an eager step on this host, from the share of that step spent in GEMM and attention kernels.

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

from bench.compile_ceiling import ceiling, gemm_share  # noqa: E402
from bench.ddp_runners import make_spec, run_raytrain, run_torchrun, run_trainyard, start_ray  # noqa: E402
from bench.table import print_markdown_table  # noqa: E402

# The bench's models, each of four blocks at width 128 (the Llama as examples/hf-llama-fsdp.yaml).
MODELS = {
    "gpt": {"name": "gpt", "n_layers": 4, "d_model": 128, "n_heads": 4, "seq_len": 64},
    "llama": {"hf": {"model_type": "llama", "config": {
        "hidden_size": 128, "intermediate_size": 344, "num_hidden_layers": 4, "num_attention_heads": 8,
        "num_key_value_heads": 4, "vocab_size": 256, "max_position_embeddings": 128}}},
}


def spec_for(model: str, steps: int, workers: int, compiled: bool):
    from workers.spec import JobSpec

    data = make_spec(steps, "bench-compile").model_dump(mode="json", exclude_unset=True)
    data["model"] = MODELS[model]
    if "hf" in MODELS[model]:
        data["data"] = {**data["data"], "seq_len": 64}
    data["parallel"] = {"dp": workers}
    data["resources"] = {**data["resources"], "workers": workers}
    data["train"] = {**data["train"], "compile": compiled}
    return JobSpec.model_validate(data)


def measure(model: str, steps: int, workers: int, work: Path) -> list[tuple[str, dict]]:
    rows = []
    for label, compiled in (("torchrun eager loop", False), ("torchrun compiled loop", True)):
        spec = spec_for(model, steps, workers, compiled)
        tag = f"torchrun-{model}-{workers}-{compiled}"
        spec_file = work / f"{tag}.json"
        spec_file.write_text(json.dumps(spec.model_dump(mode="json")))
        cache = work / f"inductor-{tag}"  # a cold cache for this run alone
        rows.append((label, run_torchrun(spec, spec_file, work, tag, nproc=workers,
                                         env_extra={"TORCHINDUCTOR_CACHE_DIR": str(cache)})))
    rows.append(("Ray Train eager loop",
                 run_raytrain(spec_for(model, steps, workers, False), work, f"raytrain-{model}-{workers}", workers)))
    from workers.parallel.compiled_blocks import compile_cache_dir
    from workers.storage import Storage

    tag = f"trainyard-{model}-{workers}"
    shutil.rmtree(compile_cache_dir(Storage.at(work / tag).uri), ignore_errors=True)
    rows.insert(0, ("Trainyard, compile: true", run_trainyard(spec_for(model, steps, workers, True), work, tag)))
    shutil.rmtree(compile_cache_dir(Storage.at(work / tag).uri), ignore_errors=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=sorted(MODELS))
    parser.add_argument("--num-cpus", type=int, default=8, help="logical CPUs of the local Ray")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=FutureWarning)
    start_ray(args.num_cpus)
    work = Path(tempfile.mkdtemp(prefix="trainyard-bench-compile-"))
    body = []
    try:
        for model in args.models:
            share = gemm_share(spec_for(model, args.steps, 1, False))
            body.append([f"{model}: compile ceiling (eager step {share:.0%} in GEMM and attention)", "1", "-",
                         f"{ceiling(share):.2f}", "-", "-"])
            for workers in args.workers:
                rows = measure(model, args.steps, workers, work)
                eager = dict(rows)["torchrun eager loop"]["sps"]
                for label, r in rows:
                    body.append([f"{model}: {label}", str(workers), f"{r['sps']:.1f}", f"{r['sps'] / eager:.2f}",
                                 f"{r['step_time_s'][0]:.1f}", f"{r['final_loss']:.4f}"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"4 blocks x d128, seq 64, global batch 32, micro-batch 8, {args.steps} steps; "
          f"load average {os.getloadavg()}")
    print_markdown_table(("system", "workers", "samples/s", "x eager loop", "first step s", "final loss"), body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
