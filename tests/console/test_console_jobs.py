"""A finished pipeline job as a user finds it: in the jobs list, then on its page with the charts, the
pipeline timeline (one element per stage, both bubbles), the rank heatmap, the events, the logs and the spec;
a read-only token's cancel is refused with the 403's message; text from a URL stays text."""

from __future__ import annotations

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from tests.console.browsing import click_css, no_alert, open_logged_in, page_errors, wait_css, wait_text
from tests.helpers import tiny_spec
from tests.live import wait_step

pytestmark = pytest.mark.slow


def test_jobs_list_shows_state_progress_and_filters(page, console_server, tenant_tokens, pipeline_job):
    open_logged_in(page, console_server.url, "/ui", tenant_tokens[0])
    row = wait_css(page, f'tr[data-job="{pipeline_job["id"]}"]')[0]
    assert pipeline_job["name"] in row.text and "SUCCEEDED" in row.text and "6/6" in row.text
    bar = row.find_element(By.TAG_NAME, "progress")
    assert bar.get_attribute("value") == bar.get_attribute("max") == "6"
    # The name filter hides it; the state filter keeps it only among SUCCEEDED jobs.
    page.find_element(By.ID, "name-filter").send_keys("no-such-name")
    assert not page.find_elements(By.CSS_SELECTOR, f'tr[data-job="{pipeline_job["id"]}"]')
    page.find_element(By.ID, "name-filter").clear()
    page.find_element(By.CSS_SELECTOR, '#state-filter option[value="FAILED"]').click()
    wait_text(page, "#jobs-status", lambda t: "No jobs" in t)
    page.find_element(By.CSS_SELECTOR, '#state-filter option[value="SUCCEEDED"]').click()
    wait_css(page, f'tr[data-job="{pipeline_job["id"]}"]')
    assert page_errors(page) == []


def test_pipeline_job_page(page, console_server, tenant_tokens, pipeline_job):
    job_id = pipeline_job["id"]
    open_logged_in(page, console_server.url, f"/ui/jobs/{job_id}", tenant_tokens[0])
    assert wait_text(page, "#job-name", bool) == pipeline_job["name"]
    # Charts: loss, samples/s and step time, each a path through the stored points.
    lines = wait_css(page, "#charts path.line", count=4)
    series = {p.get_attribute("data-series"): int(p.get_attribute("data-points")) for p in lines}
    assert min(series["loss"], series["samples/s"], series["tokens/s"], series["step time"]) >= 2, series
    assert all(p.get_attribute("d").count("L") >= 1 for p in lines)
    # MFU: a CPU job's points carry none (no peak FLOP/s), and its chart says it is for GPU jobs.
    mfu = page.find_element(By.ID, "mfu-chart")
    assert mfu.get_attribute("data-state") == "gpu-only" and "MFU: GPU jobs only" in mfu.text
    # The timeline: one element per stage, each with forward and backward blocks, and both bubbles.
    stages = wait_css(page, "#timeline [data-stage]", count=2)
    assert sorted(s.get_attribute("data-stage") for s in stages) == ["0", "1"]
    for stage in stages:
        kinds = {b.get_attribute("data-kind") for b in stage.find_elements(By.CSS_SELECTOR, "rect.block")}
        assert {"forward", "backward"} <= kinds, kinds
    measured = page.find_element(By.ID, "bubble-measured").text
    theoretical = page.find_element(By.ID, "bubble-theoretical").text
    # 1F1B over 2 stages, 4 micro-batches: (p-1)/(m+p-1) = 1/5; the measured one is the job summary's.
    assert theoretical == "20.0%"
    assert measured == f"{pipeline_job['summary']['pipeline']['bubble_fraction'] * 100:.1f}%"
    # The heatmap: a cell per rank and step.
    cells = wait_css(page, "#heatmap rect.cell", count=2 * 6)
    assert {c.get_attribute("data-rank") for c in cells} == {"0", "1"}
    # Peak memory per rank against the planner's prediction for this layout (pp=2).
    assert "MiB per rank" in wait_text(page, "#memory-prediction", lambda t: "prediction" in t, timeout=60)
    measured = (pipeline_job["summary"] or {}).get("peak_memory_bytes_per_rank") or []
    assert len(page.find_elements(By.CSS_SELECTOR, "#memory rect.mem-bar")) == sum(v is not None for v in measured)
    # Events, the spec as YAML, the logs of rank 0, the checkpoints and the exported model.
    events = page.find_element(By.ID, "events").text
    assert "SUCCEEDED" in events
    spec = page.find_element(By.ID, "spec").text
    assert "schedule: \"1f1b\"" in spec and "pp: 2" in spec
    wait_text(page, "#log-text", lambda t: len(t) > 0)
    assert page.find_element(By.ID, "download-model").is_enabled()
    assert page_errors(page) == []


@pytest.fixture(scope="module")
def running_job(console_server, tenant_tokens, pipeline_job):
    """A job that runs until a test cancels it (after the pipeline job, so they do not share the cores)."""
    with console_server.client(tenant_tokens[0]) as client:
        job = client.post("/v1/jobs", json=tiny_spec(**{"name": "console-long", "train.steps": 20_000})).json()
        # Running, with a few metric points stored (20,000 steps keep every 10th: settings.metrics_max_points).
        wait_step(client, job["id"], 35, timeout=180)
        yield job
        client.post(f"/v1/jobs/{job['id']}/cancel")  # when the follow test did not get that far


def test_read_only_token_cannot_cancel_and_is_told(page, console_server, tenant_tokens, running_job):
    open_logged_in(page, console_server.url, f"/ui/jobs/{running_job['id']}", tenant_tokens[1])
    wait_css(page, "#cancel")[0].send_keys(Keys.ENTER)  # pressed from the keyboard
    message = wait_text(page, "#cancel-message", lambda t: "403" in t)
    assert "may not" in message
    assert wait_css(page, "#job-name")  # still on the job page: a 403 does not log out
    with console_server.client(tenant_tokens[0]) as client:
        assert client.get(f"/v1/jobs/{running_job['id']}").json()["cancel_requested"] is False


def test_follow_a_running_jobs_log_until_it_ends(page, console_server, tenant_tokens, running_job):
    open_logged_in(page, console_server.url, f"/ui/jobs/{running_job['id']}", tenant_tokens[0])
    wait_css(page, "#log-follow")[0].click()
    wait_text(page, "#log-status", lambda t: "following" in t)
    wait_text(page, "#log-text", lambda t: len(t) > 0, timeout=60)
    # The stream stays open while the job runs and ends with it: cancel, and the page says the log is complete.
    with console_server.client(tenant_tokens[0]) as client:
        assert client.post(f"/v1/jobs/{running_job['id']}/cancel").status_code == 202
    wait_text(page, "#log-status", lambda t: "the job ended" in t, timeout=90)
    wait_text(page, "#job-state", lambda t: t == "CANCELLED")
    assert page_errors(page) == []


def test_compare_two_jobs_loss_curves(page, console_server, tenant_tokens, pipeline_job, running_job):
    open_logged_in(page, console_server.url, "/ui", tenant_tokens[0])
    for job in (pipeline_job, running_job):
        click_css(page, f'tr[data-job="{job["id"]}"] input.pick')
    page.find_element(By.ID, "compare-button").click()
    lines = wait_css(page, "#compare path.line", count=2)
    names = sorted(p.get_attribute("data-series") for p in lines)
    assert names == sorted(f"{j['name']} ({j['id']})" for j in (pipeline_job, running_job))
    assert all(int(p.get_attribute("data-points")) >= 2 for p in lines)
    assert page_errors(page) == []


def test_text_from_the_url_is_shown_as_text(page, console_server, tenant_tokens):
    evil = "<img src=x onerror=alert(1)>"
    open_logged_in(page, console_server.url, "/ui/jobs/" + evil, tenant_tokens[0])
    notice = wait_text(page, "#notice", lambda t: "not found" in t.lower() or "404" in t)
    assert evil in notice
    assert page.find_elements(By.TAG_NAME, "img") == [] and no_alert(page)
