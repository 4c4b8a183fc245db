"""Copy the Grafana dashboards and Prometheus rules into the Helm chart.

Helm reads files only from inside the chart directory, so the chart ships copies:
    deploy/grafana/*.json          -> helm/trainyard/dashboards/*.json
    deploy/prometheus/rules.yaml   -> helm/trainyard/rules/rules.yaml
Run after changing either (tests/deploy/test_chart_assets.py fails while they differ):
    python deploy/sync_chart_assets.py
"""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "helm" / "trainyard"


def pairs(root: Path = ROOT) -> list[tuple[Path, Path]]:
    """(source, chart copy) for every asset the chart must carry."""
    chart = root / "helm" / "trainyard"
    out = [(p, chart / "dashboards" / p.name) for p in sorted((root / "deploy" / "grafana").glob("*.json"))]
    rules = root / "deploy" / "prometheus" / "rules.yaml"
    if rules.exists():
        out.append((rules, chart / "rules" / "rules.yaml"))
    return out


def stale_copies(root: Path = ROOT) -> list[Path]:
    """Chart copies whose source is gone."""
    chart = root / "helm" / "trainyard"
    wanted = {copy for _, copy in pairs(root)}
    present = [*(chart / "dashboards").glob("*.json"), *(chart / "rules").glob("*.yaml")]
    return sorted(p for p in present if p not in wanted)


def main() -> None:
    for src, dst in pairs():
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        print(f"{src.relative_to(ROOT)} -> {dst.relative_to(ROOT)}")
    for p in stale_copies():
        p.unlink()
        print(f"removed {p.relative_to(ROOT)} (no source)")


if __name__ == "__main__":
    main()
