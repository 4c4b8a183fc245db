"""A slow rank as the console shows it: the straggler event outlined on its rank in the heatmap of compute
time per rank, and that rank's row the darkest. Exhaustive: a second training job (make test covers the
heatmap's cells in test_console_jobs.py::test_pipeline_job_page)."""

from __future__ import annotations

import re
import statistics

import pytest
from selenium.webdriver.common.by import By

from tests.console.browsing import open_logged_in, page_errors, wait_css
from tests.helpers import tiny_spec
from tests.live import ADMIN_TOKEN, TERMINAL, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.exhaustive]

SLOW_RANK_JOB = {**tiny_spec(**{"name": "console-straggler", "resources.workers": 2, "train.steps": 40,
                                "train.global_batch_size": 32, "model.d_model": 64, "checkpoint.every_steps": 0,
                                "supervisor.straggler.policy": "report", "supervisor.straggler.window": 5}),
                 "fault_injection": [{"at_step": 5, "rank": 1, "kind": "slow", "factor": 3.0}]}


def test_straggler_marked_on_its_rank_in_the_heatmap(page, console_server):
    with console_server.client(ADMIN_TOKEN) as client:  # fault injection needs the admin scope
        resp = client.post("/v1/jobs", json=SLOW_RANK_JOB)
        assert resp.status_code == 201, resp.text
        job = wait_for(client, resp.json()["id"], TERMINAL, timeout=300)
        events = client.get(f"/v1/jobs/{job['id']}/events").json()["events"]
    assert job["state"] == "SUCCEEDED", job
    assert any(e["kind"] == "straggler" and e["data"]["rank"] == 1 for e in events), events
    open_logged_in(page, console_server.url, f"/ui/jobs/{job['id']}", ADMIN_TOKEN)
    wait_css(page, "#heatmap rect.cell", count=2)
    page.find_element(By.CSS_SELECTOR, '#heat-field option[value="rank_compute_time_s"]').click()
    marks = wait_css(page, "#heatmap [data-straggler-rank]")
    assert {m.get_attribute("data-straggler-rank") for m in marks} == {"1"}
    # The slow rank's cells are the darker ones (lower lightness) after the fault's step.
    lightness: dict[str, list[int]] = {"0": [], "1": []}
    for cell in page.find_elements(By.CSS_SELECTOR, "#heatmap rect.cell"):
        if int(cell.get_attribute("data-step")) > 10:
            level = re.findall(r"(\d+)%\)", cell.get_attribute("fill"))[0]  # hsl(210, 70%, L%)
            lightness[cell.get_attribute("data-rank")].append(int(level))
    assert statistics.median(lightness["1"]) < statistics.median(lightness["0"]), lightness
    assert "straggler" in page.find_element(By.ID, "events").text
    assert page_errors(page) == []
