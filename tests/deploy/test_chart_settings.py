"""The chart and the service agree: the TRAINYARD_* variables the control plane gets are
exactly the fields of service.settings.Settings, and the chart's port, versions and
paths are the service's."""

from __future__ import annotations

import re
import tomllib

import pytest
import yaml

from service.settings import Settings
from tests.deploy.chart import CHART_DIR, ROOT, ci_values, one, render

SETTING_ENV = {f"{Settings.model_config['env_prefix']}{name.upper()}" for name in Settings.model_fields}


def control_plane_env(docs: list[dict]) -> dict[str, object]:
    """Every variable the control-plane container sees: ConfigMap envFrom, then env."""
    container = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    configmaps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    env: dict[str, object] = {}
    for source in container.get("envFrom", []):
        env.update(configmaps[source["configMapRef"]["name"]])
    for var in container.get("env", []):
        env[var["name"]] = var.get("value", var.get("valueFrom"))
    return env


@pytest.mark.parametrize("name", ["default", "production", "gpu", "monitoring"])
def test_env_names_are_exactly_the_settings_fields(name):
    env = control_plane_env(render(ci_values(name)))
    chart = {k for k in env if k.startswith("TRAINYARD_")}
    assert chart == SETTING_ENV, (
        f"only in the chart: {sorted(chart - SETTING_ENV)}; "
        f"only in service/settings.py: {sorted(SETTING_ENV - chart)}")


def test_configmap_values_parse_as_settings(monkeypatch):
    """The strings the chart writes are values pydantic accepts for each field."""
    env = control_plane_env(render(ci_values("production")))
    for key, value in env.items():
        if key.startswith("TRAINYARD_") and isinstance(value, str):
            monkeypatch.setenv(key, value)
    settings = Settings()
    assert settings.host == "0.0.0.0" and settings.port == 8600
    assert settings.ray_address == "ray://ty-trainyard-head-svc.train.svc:10001"
    assert settings.max_body_bytes == 1_000_000 and settings.loop_interval_s == 0.5


def test_port_and_probes_follow_the_service():
    docs = render()
    container = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    default_port = Settings.model_fields["port"].default
    assert container["ports"] == [{"name": "http", "containerPort": default_port, "protocol": "TCP"}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["args"] == ["serve"]
    # The paths exist in the service (read from source: importing the app pulls in Ray).
    routes = "".join(p.read_text() for p in (ROOT / "api" / "http" / "routers").glob("*.py"))
    for path in ("/readyz", "/healthz", "/metrics"):
        assert f'.get("{path}"' in routes, f"no GET {path} route in api/http/routers"


def test_ray_version_matches_pyproject():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (ray_pin,) = [d for d in deps if d.startswith("ray")]
    assert one(render(), "RayCluster")["spec"]["rayVersion"] == ray_pin.split("==")[1]


def test_chart_setting_defaults_are_the_services():
    """values.yaml `settings` start where the service does; the chart overrides only what a
    cluster needs (host, home, Ray address, storage), in templates/configmap.yaml."""
    chart = yaml.safe_load((CHART_DIR / "values.yaml").read_text())["settings"]
    for key, value in chart.items():
        field = re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()
        assert field in Settings.model_fields, f"settings.{key}: no Settings.{field}"
        assert value == Settings.model_fields[field].default, f"settings.{key}={value}, service default {Settings.model_fields[field].default}"
