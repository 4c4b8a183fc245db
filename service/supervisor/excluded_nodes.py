"""Degraded nodes a job's ranks are never placed on again (the `replace` straggler policy),
kept in the job's storage so that a new supervisor of the same job (after a control-plane or
node restart, or a preemption) keeps avoiding them instead of starting on them afresh."""

from __future__ import annotations

import json
import os

from workers.storage import Storage

LEDGER = "excluded_nodes.json"


def load(job: Storage | str | os.PathLike) -> set[str]:
    try:
        return set(json.loads(Storage.of(job).read_text(LEDGER))["nodes"])
    except FileNotFoundError:
        return set()


def save(job: Storage | str | os.PathLike, nodes: set[str]) -> None:
    Storage.of(job).write_text(LEDGER, json.dumps({"nodes": sorted(nodes)}))  # atomic: never half a file
