"""Values that cannot work are refused at install time, with a message that names them:
values.schema.json for the shape of each value, `fail` in the templates for combinations."""

from __future__ import annotations

import helm_python
import pytest

from tests.deploy.chart import CHART_DIR, ci_values, merge, refusal, render

POSTGRES = {"database": {"url": "postgresql+psycopg://u:p@db:5432/trainyard"}}


def test_sqlite_with_two_replicas_is_refused():
    message = refusal({"controlPlane": {"replicas": 2}})
    assert "controlPlane.replicas=2 needs PostgreSQL" in message
    assert "SQLite" in message and "database.url" in message


def test_two_replicas_on_postgres_render():
    docs = render(merge(POSTGRES, {"controlPlane": {"replicas": 2}}))
    assert [d["spec"]["replicas"] for d in docs if d["kind"] == "Deployment"] == [2]


def test_production_without_a_database_url_is_refused():
    message = refusal({"mode": "production"})
    assert "mode=production needs an external PostgreSQL" in message
    assert "database.url" in message and "database.existingSecret" in message


def test_a_non_postgres_database_url_is_refused():
    message = refusal({"mode": "production", "database": {"url": "mysql://u:p@db/trainyard"}})
    assert "database.url must be a PostgreSQL URL" in message


@pytest.mark.parametrize("where, bad", [
    (("controlPlane", "resources", "requests", "cpu"), "two"),
    (("controlPlane", "resources", "limits", "memory"), "1 GB"),
    (("ray", "cluster", "head", "resources", "limits", "memory"), "4gib"),
    (("ray", "cluster", "workers", "resources", "requests", "cpu"), "-1"),
    (("ray", "cluster", "workers", "sharedMemorySize"), "lots"),
    (("storage", "persistence", "size"), "50 Gi"),
])
def test_bad_resource_strings_are_refused(where, bad):
    values: dict = bad
    for key in reversed(where):
        values = {key: values}
    message = refusal(values)
    assert "/" + "/".join(where) in message, message  # the path of the offending value
    assert repr(bad) in message and "does not match pattern" in message


@pytest.mark.parametrize("values, expected", [
    ({"mode": "prod"}, "at '/mode': value must be one of 'demo', 'production'"),
    ({"controlPlane": {"replicas": 0}}, "at '/controlPlane/replicas': minimum"),
    ({"controlPlane": {"replica": 2}}, "additional properties 'replica' not allowed"),
    ({"ray": {"cluster": {"workers": {"gpusPerWorker": 1.5}}}}, "/ray/cluster/workers/gpusPerWorker"),
    ({"controlPlane": {"extraEnv": [{"name": "TRAINYARD_PORT", "value": "1"}]}}, "/controlPlane/extraEnv/0/name"),
])
def test_schema_refuses_wrong_values(values, expected):
    assert expected in refusal(values)


@pytest.mark.parametrize("values, expected", [
    ({"ray": {"cluster": {"enabled": False}}}, "ray.cluster.enabled=false needs ray.address"),
    ({"ray": {"address": "ray://other:10001"}}, "set ray.cluster.enabled=false to use it"),
    ({"ray": {"cluster": {"workers": {"minReplicas": 5, "maxReplicas": 4, "replicas": 5}}}},
     "minReplicas=5 is above maxReplicas=4"),
    ({"ray": {"cluster": {"workers": {"replicas": 9}}}}, "replicas=9 must lie between minReplicas=0 and maxReplicas=4"),
    ({"storage": {"persistence": {"enabled": False}}}, "job storage is needed: set storage.uri to an object store"),
    ({"storage": {"uri": "s3://bucket/trainyard"}},
     "storage.uri=s3://bucket/trainyard needs credentials in the control plane and every Ray pod: "
     "set storage.existingSecret"),
    ({"storage": {"uri": "gs://bucket/trainyard"}}, "or storage.credentialsFromPods=true"),
    ({"storage": {"uri": "ftp://host/trainyard"}}, "storage.uri=ftp://host/trainyard: not a supported store"),
    (merge(POSTGRES, {"database": {"existingSecret": "db"}}), "either database.url or database.existingSecret"),
])
def test_templates_refuse_combinations_that_cannot_work(values, expected):
    assert expected in refusal(values)


def test_lint_reports_schema_violations_as_errors():
    """`helm lint -f values.yaml` in CI flags a bad value. (Helm's lint mode only logs a
    template `fail`; install and template abort on it, as the tests above show.)"""
    report = helm_python.lint(CHART_DIR, {"controlPlane": {"resources": {"requests": {"cpu": "two"}}}})
    assert any("/controlPlane/resources/requests/cpu" in e for e in report["errors"]), report
    assert helm_python.lint(CHART_DIR, ci_values("production"))["errors"] == []


def test_ray_start_params_must_be_strings():
    """Helm would print a large number as 1e+09; KubeRay wants map[string]string anyway."""
    message = refusal({"ray": {"cluster": {"workers": {"rayStartParams": {"object-store-memory": 1000000000}}}}})
    assert "/ray/cluster/workers/rayStartParams/object-store-memory" in message
