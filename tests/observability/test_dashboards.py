"""Render check of the shipped Grafana dashboards: structure, uids, templating, and PromQL that only
references metrics of the catalogue."""

from __future__ import annotations

import json

import pytest

from deploy import dashboards as generator
from service.metric_catalogue import CATALOGUE, exposed_names
from tests.observability.dashboards import (
    GRAFANA,
    METRIC,
    alert_rules,
    annotation_queries,
    dashboards,
    panel_queries,
    panels,
)

UIDS = {"trainyard-fleet.json": "trainyard-fleet", "trainyard-job.json": "trainyard-job"}


def test_files_are_what_the_generator_writes():
    assert sorted(p.name for p in GRAFANA.glob("*.json")) == sorted(generator.DASHBOARDS)
    for name, build in generator.DASHBOARDS.items():
        assert (GRAFANA / name).read_text() == generator.render(build), f"run: python deploy/dashboards.py ({name})"


def test_stable_uids_and_titles():
    boards = dashboards()
    assert {name: b["uid"] for name, b in boards.items()} == UIDS
    assert len({b["title"] for b in boards.values()}) == len(boards)


@pytest.mark.parametrize("name", sorted(UIDS))
def test_dashboard_structure(name):
    board = dashboards()[name]
    json.dumps(board)  # plain JSON all the way down
    for key in ("uid", "title", "panels", "templating", "schemaVersion", "time", "annotations"):
        assert key in board, key
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids are unique"
    for p in panels(board):
        assert p["title"], p
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p["fieldConfig"]["defaults"].get("unit"), f"{p['title']}: no unit"
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}" and t["expr"] and t["refId"], p["title"]
        g = p["gridPos"]
        assert 0 <= g["x"] and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
    if name == "trainyard-job.json":
        job = variables["job"]
        assert job["type"] == "query" and "trainyard_" in job["definition"]
        for title, expr in panel_queries(board) + annotation_queries(board):
            assert 'job="$job"' in expr, f"{title}: not filtered by the job variable"


def test_every_query_uses_catalogued_metrics_only():
    known = exposed_names()
    used = set()
    for board in dashboards().values():
        for title, expr in panel_queries(board) + annotation_queries(board):
            names = set(METRIC.findall(expr))
            assert names, f"{title}: no trainyard metric in {expr}"
            assert names <= known, f"{title}: {sorted(names - known)} not in service/metric_catalogue.py"
            used |= names
        var = next((v for v in board["templating"]["list"] if v["name"] == "job"), None)
        if var:
            assert set(METRIC.findall(var["definition"])) <= known
    for rule in alert_rules():
        names = set(METRIC.findall(rule["expr"]))
        assert names and names <= known, f"{rule['alert']}: {sorted(names - known)}"
    # the must-show series are on a dashboard
    for name in ("trainyard_straggler_score", "trainyard_stage_bubble_fraction",
                 "trainyard_stage_bubble_fraction_theoretical", "trainyard_job_step_seconds",
                 "trainyard_rank_compute_seconds", "trainyard_rank_peak_memory_bytes", "trainyard_jobs",
                 "trainyard_slowest_rank_straggler_score"):
        assert name in used, name


def test_no_panel_or_alert_draws_one_series_per_rank():
    """A job's series do not grow with its ranks: only the slowest-ranks families (at most 8 ranks per job)
    carry a rank label, and every line or alert by rank reads them; other per-rank quantities are read as
    their distribution across ranks (`stat`)."""
    by_rank = {m.name for m in CATALOGUE if "rank" in m.labels}
    assert by_rank == {"trainyard_slowest_rank_straggler_score"}
    per_rank_lines = 0
    for board in dashboards().values():
        for p in panels(board):
            for t in p["targets"]:
                if "{{rank}}" in t["legendFormat"]:
                    per_rank_lines += 1
                    assert set(METRIC.findall(t["expr"])) <= by_rank, f"{p['title']}: {t['expr']}"
    assert per_rank_lines == 1  # the slowest ranks' straggler score
    for rule in alert_rules():
        if "$labels.rank" in str(rule.get("annotations")):
            assert set(METRIC.findall(rule["expr"])) & by_rank, rule["alert"]


def test_the_mfu_panel_says_why_it_is_empty():
    import json
    from pathlib import Path

    panels = json.loads(Path("deploy/grafana/trainyard-job.json").read_text())["panels"]
    mfu = next(p for p in panels if p["title"] == "Model FLOPs utilisation")
    assert "TRAINYARD_PEAK_FLOPS_PER_WORKER" in mfu["fieldConfig"]["defaults"]["noValue"]
    assert "CPU" in mfu["fieldConfig"]["defaults"]["noValue"]
