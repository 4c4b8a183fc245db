"""Proof against real components: a real Prometheus (Debian package) scrapes a live `trainyard serve`
every second while real jobs train on Ray: a pipeline job with a straggler injected on rank 1, a job
that crashes and recovers, and one that fails. Then every PromQL expression of every dashboard panel
returns data, every annotation and alert expression evaluates, the bubble series has one value per
stage, and the straggler and job-failed alerts fire."""

from __future__ import annotations

import time

import httpx
import pytest

from service.metric_catalogue import exposed_names
from tests.helpers import tiny_spec
from tests.live import TERMINAL, Server, wait_for, wait_step
from tests.observability.dashboards import (
    alert_rules,
    annotation_queries,
    dashboards,
    fill,
    panel_queries,
)
from tests.observability.prometheus import Prometheus

pytestmark = pytest.mark.slow

PIPELINE_STEPS = 5000  # cancelled once everything is proven
SLOW_FROM = 12


def pipeline_spec() -> dict:
    return tiny_spec(**{
        "name": "pp-straggler", "model.n_layers": 4, "train.steps": PIPELINE_STEPS, "train.global_batch_size": 16,
        "resources.workers": 2, "parallel.pp": 2, "parallel.pipeline": {"schedule": "1f1b", "microbatches": 4},
        "checkpoint.every_steps": 10, "supervisor.straggler": {"policy": "report", "window": 5},
        "fault_injection": [{"at_step": SLOW_FROM, "rank": 1, "kind": "slow", "factor": 4.0}]})


def eventually(check, timeout: float, every: float = 1.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(every)


@pytest.fixture
def stack(tmp_path, ray_address):
    server = Server(tmp_path / "home", f"sqlite:///{tmp_path}/ty.db", ray_address,
                    TRAINYARD_PEAK_FLOPS_PER_WORKER="1e11")  # a nominal peak, so the MFU panel has its series
    server.start()
    prom = Prometheus(tmp_path, f"127.0.0.1:{server.port}")
    try:
        prom.start()
        yield server, prom
    finally:
        with server.client() as c:  # nothing keeps training after the test
            for job in c.get("/v1/jobs").json()["jobs"]:
                if job["state"] not in TERMINAL:
                    c.post(f"/v1/jobs/{job['id']}/cancel")
                    try:
                        wait_for(c, job["id"], TERMINAL, timeout=60)
                    except AssertionError:
                        pass
        prom.stop()
        server.stop()


def test_dashboards_and_alerts_on_a_real_prometheus(stack):
    server, prom = stack
    assert prom.rules_loaded() == len(alert_rules())
    with server.client() as c:
        pp = c.post("/v1/jobs", json=pipeline_spec()).json()
        crash = c.post("/v1/jobs", json=tiny_spec(**{
            "name": "crash-recovers", "resources.workers": 2, "train.steps": 30, "checkpoint.every_steps": 10,
            "fault_injection": [{"at_step": 15, "rank": 1, "kind": "crash"}]})).json()
        fail = c.post("/v1/jobs", json=tiny_spec(**{
            "name": "crash-fails", "train.steps": 30, "fault_tolerance": {"max_restarts": 0},
            "fault_injection": [{"at_step": 3, "rank": 0, "kind": "crash"}]})).json()
        assert wait_for(c, fail["id"], TERMINAL)["state"] == "FAILED"
        assert wait_for(c, crash["id"], TERMINAL)["state"] == "SUCCEEDED"
        wait_step(c, pp["id"], SLOW_FROM + 20)
        assert c.get(f"/v1/jobs/{pp['id']}").json()["state"] == "RUNNING"

        # /metrics carries only catalogued names
        text = httpx.get(f"{server.url}/metrics").text
        names = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
        assert names <= exposed_names(), sorted(names - exposed_names())

        # the straggler alert fires for rank 1 of the pipeline job (`for: 30s`)
        def straggler_fires():
            firing = [a for a in prom.alerts() if a["labels"]["alertname"] == "TrainyardStragglerPresent"
                      and a["state"] == "firing" and a["labels"]["job"] == pp["id"]]
            assert [a["labels"]["rank"] for a in firing] == ["1"], prom.query(
                f'trainyard_slowest_rank_straggler_score{{job="{pp["id"]}"}}')
            return firing
        started = time.monotonic()
        eventually(straggler_fires, timeout=150)
        straggler_after_s = time.monotonic() - started

        failed = [a for a in prom.alerts() if a["labels"]["alertname"] == "TrainyardJobFailed"]
        assert [(a["labels"]["job"], a["state"]) for a in failed] == [(fail["id"], "firing")]

        # every panel query returns data (the job dashboard on the pipeline job)
        empty = []
        for name, board in dashboards().items():
            for title, expr in panel_queries(board):
                if not prom.query(fill(expr, job=pp["id"])):
                    empty.append(f"{name} / {title}: {expr}")
            for title, expr in annotation_queries(board):
                prom.query(fill(expr, job=pp["id"]))  # evaluates (data only when the layout changes)
        assert not empty, "panels without data:\n" + "\n".join(empty)
        for rule in alert_rules():
            prom.query(rule["expr"])  # every alert expression evaluates

        # one bubble value per stage, measured and theoretical
        for metric in ("trainyard_stage_bubble_fraction", "trainyard_stage_bubble_fraction_theoretical"):
            series = prom.query(f'{metric}{{job="{pp["id"]}"}}')
            assert sorted(s["metric"]["stage"] for s in series) == ["0", "1"], series
        theory = {s["metric"]["stage"]: float(s["value"][1])
                  for s in prom.query(f'trainyard_stage_bubble_fraction_theoretical{{job="{pp["id"]}"}}')}
        assert theory == {"0": pytest.approx(1 / 5), "1": pytest.approx(1 / 5)}  # 1F1B: (P-1)/(M+P-1), P=2, M=4
        restarts = prom.query(f'sum(trainyard_restarts_total{{job="{crash["id"]}"}})')
        assert float(restarts[0]["value"][1]) == 1.0, (  # by cause, and the job's own restart events
            prom.query(f'trainyard_restarts_total{{job="{crash["id"]}"}}'),
            [e["message"] for e in c.get(f"/v1/jobs/{crash['id']}/events").json()["events"] if "restart" in e["kind"]])
        scores = {s["metric"]["rank"]: float(s["value"][1])
                  for s in prom.query(f'trainyard_slowest_rank_straggler_score{{job="{pp["id"]}"}}')}
        print(f"\nstraggler alert firing {straggler_after_s:.0f}s after step {SLOW_FROM + 20}; scores {scores}")
        # the job metrics API puts the schedule's ideal bubble beside every measured one
        series = c.get(f"/v1/jobs/{pp['id']}/metrics").json()
        assert series["bubble_fraction_theoretical"] == pytest.approx(1 / 5)
        measured = [p for p in series["points"] if p["bubble_fraction"] is not None]
        assert measured and all(0.0 <= p["bubble_fraction"] < 1.0 for p in measured)
        assert all(p["bubble_fraction_theoretical"] == pytest.approx(1 / 5) for p in measured)
        c.post(f"/v1/jobs/{pp['id']}/cancel")
        assert wait_for(c, pp["id"], TERMINAL)["state"] == "CANCELLED"
