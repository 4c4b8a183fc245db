"""What idle gloo groups cost a training loop: the plain torchrun FSDP script of bench/hf_models.py,
run as is and with extra gloo groups it creates and never uses, interleaved in pairs.

    .venv/bin/python bench/gloo_groups.py [--extra 5] [--reps 6] [--steps 40]

Why: a Trainyard rank held six gloo groups where the torchrun script holds one (bench/notes/2026-12-05-ratio-chase.md,
"Its process"), and each group's transport runs a thread that wakes about 100 times a second even
when the group is idle. This measures what such threads cost the loop on this host, with nothing
else of Trainyard in the way. The ratio is taken within each pair (ABBA order).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.ddp_runners import run_torchrun  # noqa: E402
from bench.hf_models import make_spec  # noqa: E402
from bench.table import print_markdown_table  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--extra", type=int, default=5, help="idle gloo groups the second side adds")
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--layout", choices=("ddp", "fsdp"), default="fsdp")
    args = parser.parse_args()
    spec = make_spec(args.layout, args.steps, 128, 8, 4)
    work = Path(tempfile.mkdtemp(prefix="trainyard-bench-gloo-"))
    spec_file = work / "spec.json"
    spec_file.write_text(json.dumps(spec.model_dump(mode="json")))
    ratios, plain, extra = [], [], []
    try:
        for rep in range(args.reps):
            runs = {"plain": ("--layout", args.layout),
                    "extra": ("--layout", args.layout, "--idle-gloo-groups", str(args.extra))}
            order = ("plain", "extra") if rep % 2 == 0 else ("extra", "plain")
            got = {k: run_torchrun(spec, spec_file, work, f"{k}-{rep}", "torchrun_hf.py", runs[k])["sps"]
                   for k in order}
            plain.append(got["plain"])
            extra.append(got["extra"])
            ratios.append(got["extra"] / got["plain"])
            print(f"rep {rep}: plain {got['plain']:.2f} samples/s | +{args.extra} idle gloo groups "
                  f"{got['extra']:.2f} | ratio {ratios[-1]:.3f}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_markdown_table(
        ("layout", "plain samples/s (median)", f"+{args.extra} idle gloo groups (median)", "ratio: median [min-max]"),
        [(args.layout, f"{statistics.median(plain):.2f}", f"{statistics.median(extra):.2f}",
          f"{statistics.median(ratios):.3f} [{min(ratios):.3f}-{max(ratios):.3f}]")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
