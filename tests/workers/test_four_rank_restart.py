"""A crash restart at 4 data-parallel ranks ends bit-identical to the fault-free run, on local rank
processes (workers/runtime/local_ranks.py, no Ray). At 2 ranks a sum of two gradients does not depend
on the order of its terms; at 4 it does, so this catches a resumed step that all-reduces in another
bucket layout than the uninterrupted run (DDP's reducer rebuilt its buckets after each attempt's first step)."""

from __future__ import annotations

import pytest

from tests.helpers import spec_of
from workers.runtime.local_ranks import run_jobs

WORLD = 4
BASE = {"resources.workers": WORLD, "checkpoint.every_steps": 3, "train.steps": 8}


@pytest.mark.exhaustive  # ~20 s on a loaded 2-core host (2 starts of 4 rank processes); make test: the 2-rank restart
def test_four_rank_crash_restart_ends_bit_identical(tmp_path):
    crashing = spec_of(**BASE, fault_injection=[{"at_step": 7, "rank": 1, "kind": "crash"}])
    # One start for both: the fault-free job, then the crashing one, whose crash ends the processes.
    first = run_jobs([("clean", spec_of(**BASE)), ("crash", crashing)], WORLD, str(tmp_path))
    clean = first["clean"]
    assert [r["state"] for r in clean] == ["SUCCEEDED"] * WORLD, clean
    assert "exit code 17" in first["crash"][1]["error"]  # the injected crash (os._exit(17)) ended the attempt
    resumed = run_jobs([("crash", crashing)], WORLD, str(tmp_path))["crash"]  # the fault fired: not again
    assert [r["state"] for r in resumed] == ["SUCCEEDED"] * WORLD, resumed
    steps = [r["step"] for r in resumed[0]["records"] if "loss" in r]
    assert steps[0] in (4, 7), steps  # resumed from a checkpoint (3 or 6), not from scratch
    for rank in range(WORLD):
        assert resumed[rank]["losses"] == clean[rank]["losses"][steps[0] - 1:], rank
    assert resumed[0]["params_sha256"] == clean[0]["params_sha256"]  # rank 0 hashes the final state
