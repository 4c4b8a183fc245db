"""The console's browser tests: one real `trainyard serve` (PostgreSQL, the session's local Ray) shared by
every console test, a finished pipeline job on it, and one headless Debian Chromium per module."""

from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path

import pytest

from tests.db_fixtures import make_db_url
from tests.helpers import tiny_spec
from tests.live import ADMIN_TOKEN, TERMINAL, Server, drop_pg_schema, wait_for

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
# A 1F1B pipeline over 2 stages with 4 micro-batches (global 16 / micro 4): a few steps of the tiny GPT.
PIPELINE_JOB = tiny_spec(**{"name": "console-pipe", "model.n_layers": 2, "resources.workers": 2,
                            "parallel.pp": 2, "parallel.pipeline": {"schedule": "1f1b", "microbatches": 4},
                            "train.steps": 6})


@pytest.fixture(scope="session")
def console_server(tmp_path_factory, ray_address):
    home = tmp_path_factory.mktemp("console-home")
    url, schema = make_db_url("postgresql", home)
    server = Server(home, url, ray_address, TRAINYARD_STANDBY_SUPERVISORS="0").start()
    yield server
    server.stop()
    if schema:
        drop_pg_schema(schema)


@pytest.fixture(scope="session")
def tenant_tokens(console_server):
    """A tenant of its own: (submit+read token, read-only token)."""
    with console_server.client(ADMIN_TOKEN) as admin:
        tenant = admin.post("/v1/tenants", json={"name": f"console-{uuid.uuid4().hex[:8]}"}).json()
        reader = admin.post("/v1/tokens", json={"tenant": tenant["id"], "name": "viewer", "scopes": ["read"]}).json()
    return tenant["token"], reader["token"]


@pytest.fixture(scope="session")
def pipeline_job(console_server, tenant_tokens):
    """The pp=2 job, finished (SUCCEEDED), as the API returns it."""
    with console_server.client(tenant_tokens[0]) as client:
        resp = client.post("/v1/jobs", json=PIPELINE_JOB)
        assert resp.status_code == 201, resp.text
        job = wait_for(client, resp.json()["id"], TERMINAL, timeout=300)
    assert job["state"] == "SUCCEEDED", job
    return job


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Headless Debian Chromium through its chromedriver: no vendor telemetry, no browser download."""
    os.environ["SE_AVOID_STATS"] = "true"
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    assert shutil.which(CHROMEDRIVER) or os.path.exists(CHROMEDRIVER), "chromium-driver missing: run `make browser`"
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--window-size=1280,1000", f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.implicitly_wait(0)
    yield driver
    driver.quit()


@pytest.fixture(scope="session")
def screenshot_dir(tmp_path_factory):
    """pytest's temporary folder, or TRAINYARD_CONSOLE_SCREENSHOTS (outside the checkout) to keep them."""
    kept = os.environ.get("TRAINYARD_CONSOLE_SCREENSHOTS")
    if kept:
        Path(kept).mkdir(parents=True, exist_ok=True)
        return Path(kept)
    return tmp_path_factory.mktemp("console-screenshots")


@pytest.fixture
def page(browser, screenshot_dir, request):
    """The module's browser, its console log emptied; a screenshot of the page as the test left it."""
    browser.get_log("browser")
    yield browser
    name = re.sub(r"[^\w.-]+", "_", request.node.name)
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1280, min(max(height, 1000), 4000))  # the whole page, not just the first screen
    browser.save_screenshot(str(screenshot_dir / f"{name}.png"))
    browser.set_window_size(1280, 1000)
    print(f"screenshot: {screenshot_dir / name}.png")
