"""`make demo`: its jobs are valid specs that show what they claim, its summary is readable at 80
columns, and run from a clean copy of the checkout it trains every job to SUCCEEDED and leaves no
process behind once it has returned (its service stops the local Ray and waits for it)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from rich.console import Console

from api.cli.demo import demo_specs
from api.cli.demo_table import summary_table
from workers.spec_loading import parse_spec

ROOT = Path(__file__).resolve().parents[2]


def test_every_demo_job_is_a_valid_spec_and_the_fault_jobs_are_there():
    specs = {s["name"]: parse_spec(s, allow_fault_injection=True) for s in demo_specs()}
    assert {"gpt-ddp", "mlp-regression", "gpt-ddp-crash", "gpt-ddp-straggler"} <= set(specs)
    assert [f.kind for f in specs["gpt-ddp-crash"].fault_injection] == ["crash"]
    straggler = specs["gpt-ddp-straggler"]
    assert [f.kind for f in straggler.fault_injection] == ["slow"]
    assert straggler.supervisor.straggler.policy == "rebalance" and straggler.dp == 2
    script = specs["torchrun-script"].program
    assert script is not None and script.command[:2] == ["python", "train.py"]
    assert Path(script.working_dir, "train.py").is_file()  # made absolute from examples/torchrun-script/


def _job(name: str, state: str, loss: tuple[float, float]) -> dict:
    return {"name": name, "id": uuid.uuid4().hex[:16], "state": state, "step": 200, "total_steps": 200,
            "restarts": 1, "started_at": "2026-12-01T00:00:00", "finished_at": "2026-12-01T00:01:10",
            "summary": {"initial_loss": loss[0], "final_loss": loss[1], "samples_per_s": 12345.6}}


@pytest.mark.parametrize("width", [80, 60])
def test_the_summary_never_cuts_a_state_or_a_loss(width):
    jobs = [_job(name, state, (5.5512, 2.1034)) for name, state in
            [("gpt-ddp-straggler", "SUCCEEDED"), ("hf-llama-fsdp", "CANCELLED"), ("torchrun-script", "FAILED")]]
    console = Console(width=width, record=True)
    console.print(summary_table(jobs, width))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= width
    assert "…" not in text
    for state in ("SUCCEEDED", "CANCELLED", "FAILED"):
        assert state in text
    assert text.count("5.55→2.10") == 3
    wide = Console(width=200, record=True)
    wide.print(summary_table(jobs, 200))
    wide_text = wide.export_text()
    assert all(job["id"] in wide_text for job in jobs)  # every column when there is room


def _clean_copy(dest: Path) -> Path:
    """The checkout's files as git sees them (tracked, and new ones not ignored): no .venv, no
    .trainyard, no build output."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def _processes_with(marker: str) -> list[str]:
    """Every process whose environment carries `marker`: what the demo run started, at any depth."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if marker.encode() in (entry / "environ").read_bytes():
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append(f"{entry.name}: {command}")
        except OSError:
            continue
    return found


# 4-8 minutes on this 2-core host, and every job kind it runs is trained by a faster test of its own:
# `make test-all` (before an issue is resolved) runs it, `make test` does not.
@pytest.mark.slow
@pytest.mark.exhaustive
@pytest.mark.timeout(1200)
def test_make_demo_from_a_clean_copy_succeeds_and_leaves_nothing_running(tmp_path):
    copy = _clean_copy(tmp_path / "checkout")
    marker = f"TRAINYARD_DEMO_RUN={uuid.uuid4().hex}"
    name, value = marker.split("=")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    env.update({name: value, "COLUMNS": "80", "VENV": str(Path(sys.executable).parents[1])})
    # `-o install`: the venv under test is already installed; the demo itself runs from the copy.
    # --no-print-directory: under `make test-all` this is a sub-make, which prints its directory in lines of
    # its own (not the demo's output, whose width is checked below)
    out = subprocess.run(["make", "--no-print-directory", "-o", "install", "demo"], cwd=copy, env=env,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, (out.stdout[-4000:], out.stderr[-4000:])
    left = _processes_with(marker)
    assert not left, left
    table = out.stdout[out.stdout.index("Trainyard demo: summary"):]
    rows = [line for line in table.splitlines() if line.startswith("│") and line.split("│")[2].strip()]
    assert len(rows) == len(demo_specs()), table  # one row per job (a folded name adds a row with no state)
    assert all("SUCCEEDED" in row and re.search(r"\d+\.\d\d→\d+\.\d\d", row) for row in rows), table
    assert "…" not in table and max(len(line) for line in table.splitlines()) <= 80, table
