"""The chart lints and renders for every CI values file, and what it renders is valid:
built-in kinds against Kubernetes' schemas, RayClusters against KubeRay's CRD."""

from __future__ import annotations

import helm_python
import kubernetes_validate
import pytest
import yaml

from tests.deploy.chart import (
    CHART_DIR,
    CI_VALUES,
    CRD_DIR,
    SHARED_CRD_DIR,
    by_kind,
    ci_values,
    merge,
    one,
    render,
)
from tests.deploy.schemas import CRD_KINDS, raycluster_errors, validate_core

VALUES = {p.name.removesuffix("-values.yaml"): yaml.safe_load(p.read_text()) or {} for p in CI_VALUES}


def test_ci_values_cover_the_issue():
    assert {"default", "production", "gpu", "monitoring"} <= VALUES.keys()


@pytest.mark.parametrize("name", sorted(VALUES))
def test_lint_has_no_errors_or_warnings(name):
    report = helm_python.lint(CHART_DIR, VALUES[name], strict=True, namespace="train", kube_version="v1.33.0")
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # 2 warning, 3 error
    assert not report["errors"] and not problems, report


@pytest.mark.parametrize("name", sorted(VALUES))
def test_core_manifests_are_valid_kubernetes(name):
    docs = [d for d in render(VALUES[name]) if d["kind"] not in CRD_KINDS]
    assert docs
    for doc in docs:
        validate_core(doc)


@pytest.mark.parametrize("name", sorted(VALUES))
def test_rayclusters_match_the_kuberay_crd(name):
    clusters = by_kind(render(VALUES[name]), "RayCluster")
    assert len(clusters) == 1
    for cluster in clusters:
        assert raycluster_errors(cluster) == []


def test_crd_copy_is_current():
    """The vendored CRD is the shared one, where this checkout sits next to it."""
    assert (CRD_DIR / "SOURCE").read_text().strip()
    shared = SHARED_CRD_DIR / "ray.io_rayclusters.yaml"
    if shared.exists():
        assert (CRD_DIR / shared.name).read_bytes() == shared.read_bytes(), "copy the new CRD into tests/deploy/crds/"


def test_the_validators_reject_broken_objects():
    """The checks above can fail: a misspelt field and a bad quantity are caught."""
    docs = render()
    deployment = one(docs, "Deployment")
    deployment["spec"]["replica"] = 2
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_core(deployment)
    cluster = one(docs, "RayCluster")
    cluster["spec"]["workerGroupSpecs"][0]["minReplica"] = 1
    cluster["spec"]["workerGroupSpecs"][0]["maxReplicas"] = "4"
    errors = raycluster_errors(cluster)
    assert any("minReplica" in e for e in errors) and any("maxReplicas" in e for e in errors), errors


def test_default_is_a_single_replica_sqlite_demo():
    docs = render(ci_values("default"))
    assert one(docs, "Deployment")["spec"]["replicas"] == 1
    assert one(docs, "Deployment")["spec"]["strategy"]["type"] == "Recreate"
    claims = {d["metadata"]["name"] for d in by_kind(docs, "PersistentVolumeClaim")}
    assert claims == {"ty-trainyard-home", "ty-trainyard-storage"}
    assert not by_kind(docs, "Ingress") and not by_kind(docs, "ServiceMonitor")
    assert not by_kind(docs, "PrometheusRule")


def test_production_uses_postgres_ingress_and_an_existing_claim():
    docs = render(ci_values("production"))
    deployment = one(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 3 and deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["TRAINYARD_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "ty-trainyard", "key": "database-url"}
    assert env["TRAINYARD_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "trainyard-admin", "key": "admin-token"}
    assert not by_kind(docs, "PersistentVolumeClaim")  # no SQLite; the checkpoint claim exists
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert {"name": "storage", "persistentVolumeClaim": {"claimName": "trainyard-checkpoints"}} in volumes
    rule = one(docs, "Ingress")["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]
    assert rule == {"name": "ty-trainyard", "port": {"number": 8600}}


def test_gpu_workers_request_gpus_and_use_the_cuda_image():
    cluster = one(render(ci_values("gpu")), "RayCluster")
    (group,) = cluster["spec"]["workerGroupSpecs"]
    assert (group["minReplicas"], group["replicas"], group["maxReplicas"]) == (1, 1, 4)
    container = group["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert container["resources"]["requests"]["nvidia.com/gpu"] == 8
    assert container["image"].startswith("trainyard/ray-cuda:")
    head = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" not in head["resources"]["limits"] and "-cuda" not in head["image"]
    assert cluster["spec"]["enableInTreeAutoscaling"] is True


def test_monitoring_renders_servicemonitor_and_rules():
    docs = render(ci_values("monitoring"))
    monitor = one(docs, "ServiceMonitor")
    service = one(docs, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    # honorLabels: the series' own `job` label (the Trainyard job id) is kept, not renamed exported_job
    assert monitor["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "30s",
                                             "honorLabels": True}]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    groups = one(docs, "PrometheusRule")["spec"]["groups"]
    assert groups[0]["rules"][0]["alert"] == "TrainyardControlPlaneDown"
    assert 'job="ty-trainyard"' in groups[0]["rules"][0]["expr"]


def _env_from(container: dict) -> list[dict]:
    return container.get("envFrom", [])


def test_an_object_store_needs_no_volume_and_gives_every_pod_the_secret():
    docs = render(ci_values("object-store"))
    assert {d["metadata"]["name"] for d in by_kind(docs, "PersistentVolumeClaim")} == {"ty-trainyard-home"}
    assert one(docs, "ConfigMap")["data"]["TRAINYARD_STORAGE_URI"] == "s3://trainyard-jobs/prod"
    deployment = one(docs, "Deployment")["spec"]["template"]["spec"]
    cluster = one(docs, "RayCluster")["spec"]
    head, worker = cluster["headGroupSpec"]["template"]["spec"], cluster["workerGroupSpecs"][0]["template"]["spec"]
    pods = [deployment, head, worker]
    for pod in pods:
        assert {"secretRef": {"name": "trainyard-store"}} in _env_from(pod["containers"][0])
        assert "storage" not in {v["name"] for v in pod["volumes"]}
    elsewhere = render(merge(ci_values("object-store"),
                             {"storage": {"existingSecret": "", "credentialsFromPods": True}}))
    cluster = one(elsewhere, "RayCluster")["spec"]
    assert not any("secretRef" in e for e in _env_from(one(elsewhere, "Deployment")["spec"]["template"]["spec"]
                                                       ["containers"][0]))
    assert "envFrom" not in cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
