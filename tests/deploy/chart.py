"""Render helm/trainyard with the real Helm engine (helm_python) and load the manifests."""

from __future__ import annotations

import copy
from pathlib import Path

import helm_python
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = ROOT / "helm" / "trainyard"
CI_VALUES = sorted((CHART_DIR / "ci").glob("*-values.yaml"))
RELEASE, NAMESPACE = "ty", "train"
# KubeRay's CRDs (config/crd/bases at the commit in crds/SOURCE), vendored so a clean
# checkout can test; test_crd_copy_is_current compares them with the shared copy.
CRD_DIR = Path(__file__).resolve().parent / "crds"
SHARED_CRD_DIR = ROOT.parent / "shared" / "k8s-schemas"


def ci_values(name: str) -> dict:
    """One of helm/trainyard/ci/<name>-values.yaml."""
    return yaml.safe_load((CHART_DIR / "ci" / f"{name}-values.yaml").read_text()) or {}


def merge(base: dict, override: dict) -> dict:
    """Deep-merge override into a copy of base (how Helm layers -f files and --set)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def render_files(values: dict | None = None, chart_dir: Path = CHART_DIR) -> dict[str, str]:
    """Template path -> rendered text, as `helm template` would produce it.

    Like `helm install`, the values are checked against values.schema.json first
    (helm_python's render does not do that on its own)."""
    with helm_python.Chart.load(chart_dir) as chart:
        chart.validate_schema(chart.merge_values(values or {}))
        return chart.render(values or {}, name=RELEASE, namespace=NAMESPACE)


def render(values: dict | None = None, chart_dir: Path = CHART_DIR) -> list[dict]:
    """Every rendered Kubernetes object (NOTES.txt and empty documents left out)."""
    docs: list[dict] = []
    for path, text in sorted(render_files(values, chart_dir).items()):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def refusal(values: dict) -> str:
    """The message with which the chart refuses these values (AssertionError if it renders)."""
    try:
        render(values)
    except helm_python.HelmError as exc:
        return str(exc)
    raise AssertionError(f"the chart rendered values it should refuse: {values}")


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict], kind: str) -> dict:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {[d['metadata']['name'] for d in found]}"
    return found[0]
