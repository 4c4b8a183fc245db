"""A supervisor process never imports torch (issue 48): in a fresh interpreter, the supervisor actor's
module runs a job through the real Supervisor and JobRun (the scripted ranks and cluster of
supervisor_fakes.py, no Ray): a rank crash and restart from a real DCP checkpoint, steps, the
summary (strategy name; a pipeline job's split, whose cost model runs in a child process) and the
outcome. torch must not be in sys.modules at the end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers import spec_of
from tests.service.supervisor_fakes import empty_dcp_metadata

ROOT = Path(__file__).resolve().parents[2]

# Run in the child: the Supervisor exactly as the Ray actor runs it, with a make_run building JobRun
# on the fakes (the fleet simulator's way, bench/fleet/cluster_process.py).
CHILD = """
import json, sys, time
from pathlib import Path
import service.supervisor.actor as actor
from service.supervisor.run import JobRun
from tests.service.supervisor_fakes import AttemptScript, FakeCluster, Script, ScriptedGroup

args = json.loads(sys.argv[1])
metadata = Path(args["metadata"]).read_bytes()  # a real DCP .metadata, written by the parent with torch
out = {}
for job, spec_json in args["specs"].items():
    cluster = FakeCluster({"node-a": 2, "node-b": 2})
    crash = [AttemptScript(fail_at=5)] if job == "dp" else []  # one restart, from a real DCP checkpoint
    script = Script([*crash, AttemptScript()], total_steps=8, metadata=lambda: metadata)

    def make_run(spec, storage, job_id, **kw):
        run = JobRun(spec, storage, job_id, poll_interval_s=0.0, cluster=cluster,
                     group_factory=lambda s, d, attempt, *_: ScriptedGroup(script, cluster, s, d, attempt), **kw)
        run.settle_s, run.growth_check_s, run.capacity_poll_s = 0.0, 0.0, 0.01
        return run

    sup = actor.Supervisor(make_run=make_run)
    assert sup.start(job, spec_json, str(Path(args["root"]) / job), epoch=1)
    deadline = time.monotonic() + 60
    while not sup.status()["done"] and time.monotonic() < deadline:
        time.sleep(0.02)
    records = sup.drain(0)["records"]
    summary = sup.status()["summary"]
    events = [r for r in records if r["type"] == "event"]
    out[job] = {"state": summary["state"], "steps": summary["steps"], "restarts": summary["restarts"],
                "strategy": summary["layout"]["strategy"],
                "split": [s["blocks"] for s in (summary["pipeline"] or {}).get("split", [])],
                "step_records": sum(r["type"] == "step" for r in records),
                "restart_events": [e["data"].get("resume_step") for e in events if e["kind"] == "restart"]}
out["torch"] = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
print(json.dumps(out))
"""


def test_a_supervisor_runs_a_job_to_its_summary_without_importing_torch(tmp_path):
    specs = {"dp": spec_of(**{"resources.workers": 2, "train.steps": 8, "checkpoint.every_steps": 2,
                              "fault_tolerance.max_restarts": 2}),
             "pp": spec_of(**{"resources.workers": 2, "parallel.pp": 2, "model.n_layers": 4, "train.steps": 8,
                              "checkpoint.every_steps": 2})}
    metadata = tmp_path / "metadata"
    metadata.write_bytes(empty_dcp_metadata())
    args = {"root": str(tmp_path), "metadata": str(metadata),
            "specs": {job: spec.model_dump(mode="json") for job, spec in specs.items()}}
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["torch"] == []
    for job, strategy, restarts in (("dp", "ddp", [4]), ("pp", "pipeline", [])):
        assert out[job]["state"] == "SUCCEEDED", out[job]
        assert (out[job]["steps"], out[job]["strategy"], out[job]["step_records"] >= 8) == (8, strategy, True)
        # dp: resumed from step 4, the checkpoint its real DCP metadata says is complete
        assert (out[job]["restarts"], out[job]["restart_events"]) == (len(restarts), restarts)
    assert out["pp"]["split"] == [[0, 1], [2, 3]]  # the cost model's balanced split of 4 blocks, from the child
    assert out["dp"]["split"] == []
