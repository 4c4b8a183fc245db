"""Submitting from the console: the YAML editor checked against the JobSpec schema as the user types, with
each problem beside its line; the planner's table; a good spec submitted, then found in the jobs list."""

from __future__ import annotations

import uuid

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from tests.console.browsing import no_alert, open_logged_in, page_errors, wait_css, wait_text

pytestmark = pytest.mark.slow

GOOD = """name: {name}
model: {{name: gpt, n_layers: 1, d_model: 32, n_heads: 2, seq_len: 32}}
data: {{name: "text:pystdlib", max_bytes: 200000}}
train:
  steps: 3
  global_batch_size: 8
  micro_batch_size: 4
resources: {{workers: 1}}
"""


def type_spec(page, text: str) -> None:
    editor = wait_css(page, "#spec-editor")[0]
    editor.send_keys(Keys.CONTROL, "a")
    editor.send_keys(Keys.DELETE)
    # The editor is a plain textarea: set the text and tell the page it changed, as typing does.
    page.execute_script("arguments[0].value = arguments[1]; arguments[0].dispatchEvent(new Event('input'))",
                        editor, text)


def problems(page) -> list[tuple[str, str]]:
    return [(li.get_attribute("data-line"), li.text) for li in page.find_elements(By.CSS_SELECTOR, "#spec-errors li")]


def test_schema_errors_are_shown_beside_their_lines(page, console_server, tenant_tokens):
    open_logged_in(page, console_server.url, "/ui/submit", tenant_tokens[0])
    bad = GOOD.format(name="bad-spec").replace("  steps: 3", "  steps: -3").replace("n_heads: 2", "n_headz: 2")
    type_spec(page, bad)
    wait_text(page, "#spec-errors", lambda t: "steps" in t)
    found = problems(page)
    assert ("5", "line 5 train.steps: must be ≥ 1") in found, found
    assert any(line == "2" and "n_headz" in text and "unknown key" in text for line, text in found), found
    # A YAML slip names its line too.
    type_spec(page, "name: x\ntrain: {steps: 3\nmodel: {}\n")
    wait_text(page, "#spec-errors", lambda t: "unclosed" in t or "expected" in t)
    assert problems(page)[0][0] == "2"
    assert page_errors(page) == []


def test_a_job_name_with_markup_is_shown_as_text(page, console_server, tenant_tokens):
    open_logged_in(page, console_server.url, "/ui/submit", tenant_tokens[0])
    evil = "<img src=x onerror=alert(1)>"
    type_spec(page, GOOD.format(name=f'"{evil}"'))
    text = wait_text(page, "#spec-errors", lambda t: "name" in t)
    assert evil in text and "must match" in text
    assert page.find_elements(By.TAG_NAME, "img") == [] and no_alert(page)


def test_plan_then_submit_a_good_spec_and_find_it_listed(page, console_server, tenant_tokens):
    name = f"console-{uuid.uuid4().hex[:6]}"
    open_logged_in(page, console_server.url, "/ui/submit", tenant_tokens[0])
    type_spec(page, GOOD.format(name=name).replace("workers: 1", "workers: 2"))
    wait_text(page, "#spec-errors", lambda t: "No problems" in t)
    page.find_element(By.ID, "plan-button").click()
    rows = wait_css(page, "#plan tbody tr", timeout=60)
    assert len(rows) >= 2 and all("MiB" in r.text for r in rows)  # every layout with its predicted peak
    type_spec(page, GOOD.format(name=name))
    page.find_element(By.ID, "submit-button").click()
    assert wait_text(page, "#job-name", bool) == name  # the new job's page
    page.find_element(By.LINK_TEXT, "← Jobs").click()
    row = wait_css(page, "tr[data-job]")
    assert any(name in r.text for r in page.find_elements(By.CSS_SELECTOR, "tr[data-job]")), row
    assert page_errors(page) == []


def test_the_service_refusal_is_shown_beside_the_field_it_names(page, console_server, tenant_tokens):
    """A spec the schema accepts but a cross-field rule refuses: the 422's message beside its field's line."""
    open_logged_in(page, console_server.url, "/ui/submit", tenant_tokens[0])
    type_spec(page, GOOD.format(name="refused").replace("micro_batch_size: 4", "micro_batch_size: 3"))
    wait_text(page, "#spec-errors", lambda t: "No problems" in t)
    page.find_element(By.ID, "submit-button").click()
    wait_text(page, "#submit-status", lambda t: "422" in t)
    found = problems(page)
    assert found and all(line in ("4", "5", "6", "7") for line, _ in found), found
    assert page_errors(page, allowed=("422",)) == []
