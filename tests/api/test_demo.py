"""`make demo`'s jobs are valid specs and show what they claim (the demo itself runs by hand: ~1 min)."""

from __future__ import annotations

from pathlib import Path

from api.cli.demo import demo_specs
from workers.spec_loading import parse_spec


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
