"""The fleet simulator as a user runs it (`python -m bench.fleet --json OUT`), at a small size: it
drives the real service over HTTP on PostgreSQL and writes every key of the contract."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTRACT = ("nodes", "queued", "running", "big_job_ranks", "database", "control_pass_p99_s",
            "admission_latency_p99_s", "api_read_p99_s", "api_submit_p99_s", "prometheus_series", "scrape_s",
            "supervisor_bytes_per_step", "supervisor_calls_per_poll", "starved_tenants", "backfilled_jobs",
            "big_job_started", "big_job_wait_s")
PARTS = ("pass_cpu_p50_s", "pass_cpu_p99_s", "cluster_wait_p99_s", "database_p99_s", "other_wait_p99_s")


def test_a_small_fleet_writes_every_contract_key(tmp_path):
    out = tmp_path / "fleet.json"
    cmd = [sys.executable, "-m", "bench.fleet", "--nodes", "16", "--tenants", "4", "--queued", "40", "--running", "6",
           "--big-job-ranks", "48", "--big-steps", "400", "--minutes", "0.6", "--settle-s", "30", "--node-losses", "1",
           "--min-steps", "5", "--max-steps", "15", "--checkpoint-every", "5", "--reserve-after-s", "3",
           "--json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert not [key for key in CONTRACT if key not in figures], figures
    assert not [f"{loop}_{part}" for loop in ("reconcile", "schedule") for part in PARTS
                if f"{loop}_{part}" not in figures], figures
    assert figures["nodes"] == 16 and figures["big_job_ranks"] == 48 and figures["database"] == "postgresql"
    assert figures["running"] >= 1 and figures["node_losses"] == 1
    assert figures["control_pass_p99_s"] > 0 and figures["api_read_p99_s"] > 0 and figures["api_submit_p99_s"] > 0
    assert figures["prometheus_series"] > 0 and figures["scrape_s"] > 0
    # short jobs end within the window: the 48-rank job gets its reservation and starts
    assert figures["big_job_started"] is True, figures
    # one call per node the job occupies (six 8-GPU nodes when packed, more when other jobs hold part of a node)
    assert 6 <= figures["big_job_nodes"] < 48, figures
    assert figures["supervisor_calls_per_poll"] == figures["big_job_nodes"], figures
    assert figures["supervisor_bytes_per_step"] is not None and figures["supervisor_bytes_per_step"] < 1024
    assert figures["backfilled_jobs"] >= 1 and figures["starved_tenants"] <= 1
    # where each loop's pass time went (bench/fleet/pass_time.py): the parts of the same passes
    for loop in ("reconcile", "schedule"):
        assert figures[f"{loop}_passes_split"] >= 1, figures
        parts = [figures[f"{loop}_{part}"] for part in PARTS]
        assert all(part is not None and part >= 0 for part in parts), (loop, parts)
        wall = figures[f"{loop}_pass_timed_p99_s"]
        assert figures[f"{loop}_pass_cpu_p50_s"] <= figures[f"{loop}_pass_cpu_p99_s"] <= wall, figures
        assert max(parts) <= wall, figures  # each part is a share of its pass's wall time
