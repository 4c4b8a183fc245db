"""What the rendered objects promise each other and the cluster: selectors that match,
non-root pods, only the API port open to the outside, one shared checkpoint volume,
the control plane pointed at the RayCluster's head."""

from __future__ import annotations

import base64

import pytest

from tests.deploy.chart import by_kind, ci_values, one, render

NAMES = ["default", "production", "gpu", "monitoring"]


def pod_specs(docs: list[dict]) -> dict[str, dict]:
    """Every pod template the release creates, by a readable name."""
    pods = {"control-plane": one(docs, "Deployment")["spec"]["template"]}
    for cluster in by_kind(docs, "RayCluster"):
        pods["ray-head"] = cluster["spec"]["headGroupSpec"]["template"]
        for group in cluster["spec"]["workerGroupSpecs"]:
            pods[f"ray-{group['groupName']}"] = group["template"]
    return pods


@pytest.mark.parametrize("name", NAMES)
def test_selectors_pick_the_control_plane_pods(name):
    docs = render(ci_values(name))
    labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    selectors = [one(docs, "Deployment")["spec"]["selector"]["matchLabels"],
                 one(docs, "Service")["spec"]["selector"],
                 one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"]]
    for selector in selectors:
        assert selector.items() <= labels.items()
    # ...and no Ray pod: their component labels differ.
    for pod_name, pod in pod_specs(docs).items():
        if pod_name != "control-plane":
            assert not one(docs, "Service")["spec"]["selector"].items() <= pod["metadata"]["labels"].items()


@pytest.mark.parametrize("name", NAMES)
def test_every_pod_runs_as_non_root(name):
    for pod_name, pod in pod_specs(render(ci_values(name))).items():
        spec = pod["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True, pod_name
        assert spec["securityContext"]["runAsUser"] != 0, pod_name
        for container in spec["containers"]:
            ctx = container["securityContext"]
            assert ctx["allowPrivilegeEscalation"] is False and ctx["capabilities"]["drop"] == ["ALL"], pod_name
            assert container["resources"]["requests"] and container["resources"]["limits"], pod_name


def test_control_plane_root_filesystem_is_read_only_with_writable_mounts():
    pod = pod_specs(render())["control-plane"]["spec"]
    container = pod["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["automountServiceAccountToken"] is False
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    env = one(render(), "ConfigMap")["data"]
    assert {env["TRAINYARD_HOME"], "/tmp"} <= mounts


@pytest.mark.parametrize("name", NAMES)
def test_only_the_api_port_is_open_to_the_outside(name):
    docs = render(ci_values(name))
    policies = {p["metadata"]["name"]: p["spec"] for p in by_kind(docs, "NetworkPolicy")}
    api, ray = policies["ty-trainyard-api"], policies["ty-trainyard-ray"]
    assert api["podSelector"]["matchLabels"] == one(docs, "Service")["spec"]["selector"]
    assert [r["ports"] for r in api["ingress"]] == [[{"port": "http", "protocol": "TCP"}]]
    # Ray pods: every rule admits this release's pods only (no ports open to all).
    assert ray["podSelector"]["matchLabels"] == {"ray.io/cluster": "ty-trainyard"}
    (rule,) = ray["ingress"]
    assert rule["from"][0] == {"podSelector": {"matchLabels": {"app.kubernetes.io/instance": "ty"}}}
    assert ray["policyTypes"] == api["policyTypes"] == ["Ingress"]
    for pod in pod_specs(docs).values():
        assert pod["metadata"]["labels"]["app.kubernetes.io/instance"] == "ty"


def test_control_plane_talks_to_the_rayclusters_head():
    docs = render()
    cluster = one(docs, "RayCluster")["metadata"]["name"]
    # KubeRay names the head Service <cluster>-head-svc; 10001 is the Ray Client port.
    assert one(docs, "ConfigMap")["data"]["TRAINYARD_RAY_ADDRESS"] == f"ray://{cluster}-head-svc.train.svc:10001"
    ports = {p["name"]: p["containerPort"] for p in pod_specs(docs)["ray-head"]["spec"]["containers"][0]["ports"]}
    assert ports["client"] == 10001


def test_an_existing_ray_cluster_replaces_the_raycluster():
    docs = render({"ray": {"address": "ray://ray-head.ray:10001", "cluster": {"enabled": False}}})
    assert not by_kind(docs, "RayCluster")
    assert one(docs, "ConfigMap")["data"]["TRAINYARD_RAY_ADDRESS"] == "ray://ray-head.ray:10001"
    assert [p["metadata"]["name"] for p in by_kind(docs, "NetworkPolicy")] == ["ty-trainyard-api"]


def test_checkpoint_volume_is_shared_at_one_path():
    docs = render()
    claim = "ty-trainyard-storage"
    for pod_name, pod in pod_specs(docs).items():
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["storage"]["persistentVolumeClaim"]["claimName"] == claim, pod_name
        for container in pod["spec"]["containers"]:
            assert {"name": "storage", "mountPath": "/mnt/trainyard"} in container["volumeMounts"], pod_name
    assert one(docs, "ConfigMap")["data"]["TRAINYARD_STORAGE_URI"] == "file:///mnt/trainyard/storage"
    assert "ReadWriteMany" in [d for d in by_kind(docs, "PersistentVolumeClaim")
                               if d["metadata"]["name"] == claim][0]["spec"]["accessModes"]


def test_an_existing_claim_is_mounted_not_created():
    docs = render({"storage": {"persistence": {"existingClaim": "nfs-checkpoints"}}})
    assert [d["metadata"]["name"] for d in by_kind(docs, "PersistentVolumeClaim")] == ["ty-trainyard-home"]
    for pod in pod_specs(docs).values():
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["storage"]["persistentVolumeClaim"]["claimName"] == "nfs-checkpoints"


def test_a_storage_uri_replaces_the_volume():
    docs = render({"storage": {"uri": "file:///mnt/nfs/trainyard"}})
    assert one(docs, "ConfigMap")["data"]["TRAINYARD_STORAGE_URI"] == "file:///mnt/nfs/trainyard"
    assert [d["metadata"]["name"] for d in by_kind(docs, "PersistentVolumeClaim")] == ["ty-trainyard-home"]
    for pod in pod_specs(docs).values():
        assert "storage" not in {v["name"] for v in pod["spec"]["volumes"]}


def test_admin_token_is_generated_once_and_never_in_the_configmap():
    docs = render()
    (secret,) = by_kind(docs, "Secret")
    assert len(secret["data"]["admin-token"]) >= 40
    assert not any("TOKEN" in k or "DATABASE" in k for k in one(docs, "ConfigMap")["data"])
    given = render({"auth": {"adminToken": "s3cret-token"}})
    assert base64.b64decode(one(given, "Secret")["data"]["admin-token"]) == b"s3cret-token"
    assert not by_kind(render({"auth": {"existingSecret": "mine"}}), "Secret")


def test_settings_change_rolls_the_pods():
    def checksum(values):
        return one(render(values), "Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]

    assert checksum({}) == checksum({}) != checksum({"settings": {"accessLog": True}})
