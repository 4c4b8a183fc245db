"""Shared helpers: the dashboards' and rules' PromQL, with Grafana's variables filled in."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "deploy" / "grafana"
RULES = ROOT / "deploy" / "prometheus" / "rules.yaml"
METRIC = re.compile(r"\btrainyard_[a-z0-9_]+\b")


def dashboards() -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(GRAFANA.glob("*.json"))}


def panels(board: dict) -> list[dict]:
    out = []
    for p in board["panels"]:
        if p["type"] == "row":
            out.extend(p.get("panels", []))
        else:
            out.append(p)
    return out


def panel_queries(board: dict) -> list[tuple[str, str]]:
    """(panel title, expr) for every target of every panel."""
    return [(p["title"], t["expr"]) for p in panels(board) for t in p["targets"]]


def annotation_queries(board: dict) -> list[tuple[str, str]]:
    return [(a["name"], a["expr"]) for a in board["annotations"]["list"] if "expr" in a]


def alert_rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def fill(expr: str, job: str = "", rate_interval: str = "1m") -> str:
    """Grafana's variables as a Prometheus query needs them."""
    return expr.replace("$__rate_interval", rate_interval).replace("$job", job)
