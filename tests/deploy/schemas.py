"""Validators for rendered objects: Kubernetes' own schemas and KubeRay's CRD schema."""

from __future__ import annotations

from functools import lru_cache

import jsonschema
import kubernetes_validate
import yaml

from tests.deploy.chart import CRD_DIR

# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest that
# kubernetes-validate ships: the manifests must be valid on both.
K8S_VERSIONS = ("1.27.0", "1.37.0")
# Kinds that come from CRDs: RayCluster is checked against KubeRay's schema below; the
# Prometheus Operator kinds have no schema here (their fields are checked by tests).
CRD_KINDS = {"RayCluster", "ServiceMonitor", "PrometheusRule"}


def validate_core(obj: dict) -> None:
    """Raise if obj is not a valid object of a built-in kind (unknown fields included)."""
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


def _strict(schema):
    """The CRD schema with unknown fields refused.

    The API server drops unknown fields of a structural schema without a word, so a typo
    (minReplica) would vanish on install; jsonschema should flag it instead."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@lru_cache
def crd_validator(filename: str, version: str) -> jsonschema.Draft7Validator:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRD is 10k lines
    crd = yaml.load((CRD_DIR / filename).read_text(), Loader=loader)
    (entry,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema = _strict(entry["schema"]["openAPIV3Schema"])
    jsonschema.Draft7Validator.check_schema(schema)
    return jsonschema.Draft7Validator(schema)


def raycluster_errors(obj: dict) -> list[str]:
    """Every way obj breaks KubeRay's RayCluster CRD schema (ray.io/v1), as 'path: message'."""
    assert obj["apiVersion"] == "ray.io/v1", obj["apiVersion"]
    validator = crd_validator("ray.io_rayclusters.yaml", "v1")
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
