"""Checking a spec imports no torch (issue 47): the API accepts and refuses jobs, strategies' rules
included, in a process that never loads torch, so `trainyard serve` starts without it. Run in a fresh
interpreter: the test session itself has torch loaded."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.helpers import tiny_spec

PROBE = textwrap.dedent("""
    import json, sys, time
    started = time.perf_counter()
    import api.cli.processes, service.storage_check  # what `trainyard serve` imports
    from api.http.app import create_app
    imported_s = time.perf_counter() - started
    from fastapi.testclient import TestClient
    from service.control import ControlPlane
    from service.db.engine import migrate
    from service.settings import Settings
    from tests.live import ADMIN_TOKEN

    settings = Settings(home=sys.argv[1], admin_token=ADMIN_TOKEN)
    app = create_app(settings)
    plane = ControlPlane(settings)
    migrate(plane.engine)
    plane.bootstrap_admin()
    app.state.plane = plane  # no Ray and no loops: only the API's own work
    client = TestClient(app, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    answers = [client.post("/v1/jobs", json=spec) for spec in json.loads(sys.argv[2])]
    from workers.spec_checks import checked_spec
    checked = checked_spec(json.loads(sys.argv[3]))  # SDP: checked without torch (its memory is predicted on
    # its subnetwork, built on the meta device: the API does that at submit)
    print(json.dumps({"status": [a.status_code for a in answers], "fields": [
        [e.get("field") for e in a.json().get("errors", [])] for a in answers], "sdp": checked.parallel.sdp.coverage,
        "torch": "torch" in sys.modules, "imported_s": imported_s}))
""")


def test_the_api_accepts_and_refuses_jobs_of_every_layout_without_importing_torch(tmp_path):
    specs = [
        tiny_spec(**{"resources.workers": 2, "parallel.pp": 2, "model.n_layers": 2}),  # pipeline
        tiny_spec(**{"resources.workers": 4, "parallel.zero": 3, "parallel.dp_shard": 2}),  # HSDP
        tiny_spec(**{"resources.workers": 2, "parallel.zero": 2, "parallel.offload_optimizer": True}),  # ZeRO-2
        tiny_spec(**{"resources.workers": 2, "parallel.tp": 3}),  # refused: tp x workers, heads
        tiny_spec(**{"resources.workers": 2, "parallel.zero": 1, "parallel.compression": {"kind": "fp16"}}),
    ]
    sdp = tiny_spec(**{"resources.workers": 2, "parallel.sdp": {"coverage": 0.75}, "model.n_layers": 4})
    out = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path), json.dumps(specs), json.dumps(sdp)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["status"] == [201, 201, 201, 422, 422], got
    assert "parallel" in got["fields"][3] and "parallel.tp" in got["fields"][3], got
    assert got["fields"][4] == ["parallel.compression"], got
    assert got["sdp"] == 0.75
    assert not got["torch"], "checking a spec imported torch"
