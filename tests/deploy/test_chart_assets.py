"""Dashboards and alert rules reach the chart: the chart's copies equal deploy/grafana/*.json
and deploy/prometheus/rules.yaml, and the templates turn them into ConfigMaps with the
Grafana sidecar label and a PrometheusRule."""

from __future__ import annotations

import json
import shutil

import yaml

from deploy import sync_chart_assets
from tests.deploy.chart import CHART_DIR, ROOT, by_kind, ci_values, merge, one, render

GRAFANA_ON = {"grafana": {"dashboards": {"enabled": True}}}
RULES_ON = {"metrics": {"prometheusRule": {"enabled": True}}}


def test_chart_copies_equal_the_sources():
    out_of_date = [str(dst.relative_to(ROOT)) for src, dst in sync_chart_assets.pairs()
                   if not dst.exists() or dst.read_bytes() != src.read_bytes()]
    stale = [str(p.relative_to(ROOT)) for p in sync_chart_assets.stale_copies()]
    assert not out_of_date and not stale, (
        f"chart copies out of date: {out_of_date}, without a source: {stale}; "
        "run: python deploy/sync_chart_assets.py")


def test_every_dashboard_in_the_chart_becomes_a_labelled_configmap():
    shipped = sorted(p.name for p in (CHART_DIR / "dashboards").glob("*.json"))
    maps = by_kind(render(ci_values("monitoring")), "ConfigMap")
    dashboards = [m for m in maps if m["metadata"]["labels"].get("grafana_dashboard") == "1"]
    assert sorted(k for m in dashboards for k in m["data"]) == shipped


def _chart_with(tmp_path, files: dict[str, str]):
    """A copy of the chart with extra files in it (dashboards/x.json, rules/rules.yaml)."""
    chart = tmp_path / "trainyard"
    shutil.copytree(CHART_DIR, chart)
    for name, text in files.items():
        (chart / name).write_text(text)
    return chart


def test_dashboard_glob_and_label(tmp_path):
    board = json.dumps({"title": "Trainyard jobs", "panels": [{"type": "timeseries"}]}, indent=1)
    chart = _chart_with(tmp_path, {"dashboards/Jobs_Overview.json": board})
    assert not by_kind(render({}, chart), "ConfigMap")[1:]  # off by default: only the settings
    docs = render(merge(GRAFANA_ON, {"grafana": {"dashboards": {"namespace": "monitoring"}}}), chart)
    (cm,) = [d for d in by_kind(docs, "ConfigMap") if "grafana_dashboard" in d["metadata"]["labels"]
             and "Jobs_Overview.json" in d["data"]]  # the shipped dashboards are there too
    assert cm["metadata"]["name"] == "ty-trainyard-dashboard-jobs-overview"
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["annotations"]["grafana_folder"] == "Trainyard"
    assert json.loads(cm["data"]["Jobs_Overview.json"]) == json.loads(board)


def test_rules_file_groups_join_the_prometheusrule(tmp_path):
    rules = {"groups": [{"name": "trainyard-jobs", "rules": [
        {"alert": "TrainyardJobFailing", "expr": "increase(trainyard_job_failures_total[10m]) > 0"}]}]}
    chart = _chart_with(tmp_path, {"rules/rules.yaml": yaml.safe_dump(rules)})
    assert not by_kind(render({}, chart), "PrometheusRule")  # off by default
    groups = one(render(RULES_ON, chart), "PrometheusRule")["spec"]["groups"]
    assert [g["name"] for g in groups] == ["trainyard-availability", "trainyard-jobs"]
    assert groups[1] == rules["groups"][0]


def test_sync_copies_and_prunes(tmp_path):
    (tmp_path / "deploy" / "grafana").mkdir(parents=True)
    (tmp_path / "deploy" / "prometheus").mkdir()
    (tmp_path / "deploy" / "grafana" / "a.json").write_text("{}")
    (tmp_path / "deploy" / "prometheus" / "rules.yaml").write_text("groups: []\n")
    for sub in ("dashboards", "rules"):
        (tmp_path / "helm" / "trainyard" / sub).mkdir(parents=True)
    old = tmp_path / "helm" / "trainyard" / "dashboards" / "gone.json"
    old.write_text("{}")
    pairs = sync_chart_assets.pairs(tmp_path)
    assert [dst.name for _, dst in pairs] == ["a.json", "rules.yaml"]
    assert sync_chart_assets.stale_copies(tmp_path) == [old]
