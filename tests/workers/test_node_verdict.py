"""`node_lost` waits for Ray's verdict on a rank's node (its restart is then charged to the cluster,
not the job), but a cancel ends the wait at once: a user cancelling a job whose rank just died does
not wait out Ray's health checks (up to a minute)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_a_cancel_ends_the_wait_for_a_frozen_nodes_verdict(tmp_path):
    out = tmp_path / "out.json"
    run = subprocess.run([sys.executable, "-m", "tests.workers.node_verdict_scenario", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["uncancelled"] is False and result["uncancelled_s"] >= 4, result  # it would have waited
    assert result["cancelled"] is False and result["cancelled_s"] < 3, result
