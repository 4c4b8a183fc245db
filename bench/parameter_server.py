"""The parameter server against DDP on model 'dlrm' and the same click logs, measured in one run.

Run from the repository root (a few minutes on a loaded 2-core machine with the defaults):

    .venv/bin/python bench/parameter_server.py [--workers 2] [--steps 60] [--tables 20000,20000,5000,1000]
        [--json OUT]

Rows: DDP (every trainer holds the tables, their gradients all-reduced dense), then the parameter server
with 2 shards in sync (AdamW on the shards: DDP's math), sync with Adagrad, bounded (staleness 2) and async.
Columns: samples/s (and its ratio to DDP), the final training and validation loss, the validation AUC, the
largest and mean staleness a trainer read, the embedding rows moved per step (pulled + pushed, all trainers)
against the rows DDP all-reduces (every row of every table), and the logical bytes per step.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.table import print_markdown_table  # noqa: E402
from service.ray_client import connect  # noqa: E402
from service.settings import Settings  # noqa: E402
from service.supervisor.run import JobRun  # noqa: E402
from workers.spec_loading import parse_spec  # noqa: E402

SERVERS: dict[str, dict | None] = {
    "ddp": None,
    "ps sync (adamw)": {"shards": 2, "mode": "sync", "optimizer": "adamw"},
    "ps sync (adagrad)": {"shards": 2, "mode": "sync"},
    "ps bounded K=2": {"shards": 2, "mode": "bounded", "staleness": 2},
    "ps async": {"shards": 2, "mode": "async"},
}


def spec_of(server: dict | None, args) -> dict:
    tables = [int(t) for t in args.tables.split(",")]
    spec = {
        "name": "dlrm-bench",
        "model": {"name": "dlrm", "table_sizes": tables, "embedding_dim": 16},
        "data": {"name": "synthetic:clicks", "n_samples": 32768},
        "train": {"steps": args.steps, "global_batch_size": 128, "micro_batch_size": 32, "lr": 1e-2,
                  "loss": "bce", "grad_clip": None},
        "resources": {"workers": args.workers},
    }
    if server is not None:
        spec["parallel"] = {"parameter_server": copy.deepcopy(server)}
    return spec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--tables", default="20000,20000,5000,1000")
    parser.add_argument("--json")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ps-bench-"))
    connect(Settings(home=root / "home"))
    dense_rows = sum(int(t) for t in args.tables.split(","))
    results = {}
    for label, server in SERVERS.items():
        spec = parse_spec(spec_of(server, args))
        job_dir = root / label.replace(" ", "-").replace("(", "").replace(")", "").replace("=", "")
        summary = JobRun(spec, job_dir, job_dir.name).run()
        if summary["state"] != "SUCCEEDED":
            raise SystemExit(f"{label}: {summary['state']} {summary['error']}")
        results[label] = summary
    base = results["ddp"]["samples_per_s"]
    body = []
    for label, s in results.items():
        ps = s.get("parameter_server") or {}
        rows = ps.get("rows_per_step")
        body.append([label, f"{s['samples_per_s']:.0f}", f"{s['samples_per_s'] / base:.2f}", f"{s['final_loss']:.4f}",
                     f"{s['final_val_loss']:.4f}", f"{s['final_val_auc']:.3f}", str(ps.get("max_staleness", "-")),
                     f"{ps['mean_staleness']:.2f}" if ps else "-",
                     f"{rows:.0f}" if rows is not None else f"{dense_rows} (all)", f"{s['comm_bytes_per_step']:.0f}"])
    print(f"dlrm, tables {args.tables}, dim 16, {args.workers} workers, {args.steps} steps, global batch 128")
    print_markdown_table(("run", "samples/s", "x DDP", "final loss", "val loss", "val AUC", "max stale",
                          "mean stale", "embedding rows/step", "comm bytes/step"), body)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
