"""Alert rules: `promtool check rules` passes and the unit tests of rules_test.yaml pass (promtool
from the Debian package `prometheus`; `make prometheus` installs it)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.observability.dashboards import RULES, alert_rules

ALERTS = {"TrainyardJobFailed", "TrainyardJobNoProgress", "TrainyardJobRestartingRepeatedly",
          "TrainyardStragglerPresent", "TrainyardPipelineBubbleAboveTheory", "TrainyardCheckpointSlow"}


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool missing: run `make prometheus` (apt-get install prometheus)"
    return path


def test_the_issue_alerts_exist_with_severity_and_summary():
    rules = {r["alert"]: r for r in alert_rules()}
    assert ALERTS <= set(rules)
    for name, rule in rules.items():
        assert rule["labels"]["severity"] in {"info", "warning", "critical"}, name
        assert rule["annotations"]["summary"], name


def test_promtool_check_rules():
    out = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("rules_test", ["rules_test.yaml"])
def test_promtool_unit_tests(rules_test):
    out = subprocess.run([promtool(), "test", "rules", rules_test], capture_output=True, text=True,
                         cwd=RULES.parent)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout
