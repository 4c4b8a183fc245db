"""Degraded nodes a job's ranks are never placed on again (the `replace` straggler policy),
kept in the job directory so that a new supervisor of the same job (after a control-plane or
node restart, or a preemption) keeps avoiding them instead of starting on them afresh."""

from __future__ import annotations

import json
import os
from pathlib import Path

LEDGER = "excluded_nodes.json"


def load(job_dir: Path) -> set[str]:
    path = job_dir / LEDGER
    return set(json.loads(path.read_text())["nodes"]) if path.exists() else set()


def save(job_dir: Path, nodes: set[str]) -> None:
    tmp = job_dir / f".{LEDGER}.tmp"
    tmp.write_text(json.dumps({"nodes": sorted(nodes)}))
    os.replace(tmp, job_dir / LEDGER)  # readers never see half a file
