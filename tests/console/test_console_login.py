"""Logging in to the console: a token from the URL fragment or the form, kept in the tab; a refused token
shows the 401's message with the login form again, and the polling stops."""

from __future__ import annotations

import time

import pytest
from selenium.webdriver.common.by import By

from tests.console.browsing import open_logged_in, page_errors, wait_css, wait_text

pytestmark = pytest.mark.slow


def test_fragment_token_logs_in_and_leaves_the_url(page, console_server, tenant_tokens, pipeline_job):
    open_logged_in(page, console_server.url, "/ui", tenant_tokens[0])
    rows = wait_css(page, f'tr[data-job="{pipeline_job["id"]}"]')
    assert "#token" not in page.current_url  # the token does not stay in the address bar or history
    assert page.execute_script("return sessionStorage.getItem('trainyard.token')") == tenant_tokens[0]
    assert "SUCCEEDED" in rows[0].text
    assert page_errors(page) == []


def test_form_login_and_a_bad_token_shows_the_401_with_the_login(page, console_server, tenant_tokens):
    page.get(console_server.url + "/ui")
    page.execute_script("sessionStorage.clear()")
    page.get(console_server.url + "/ui")
    field = wait_css(page, "#login #token")[0]
    field.send_keys("ty_not_a_token")
    page.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()
    message = wait_text(page, "#login-error", lambda t: "401" in t)
    assert "refused" in message and "Log in again" in message
    assert page.execute_script("return sessionStorage.getItem('trainyard.token')") is None
    # The refused token stopped the polling: no further requests are made with it.
    sent = page.execute_script("return performance.getEntriesByType('resource').filter("
                               "e => e.name.includes('/v1/jobs')).length")
    time.sleep(4)
    assert page.execute_script("return performance.getEntriesByType('resource').filter("
                               "e => e.name.includes('/v1/jobs')).length") == sent
    # The way back: the form logs in with a good token.
    field = wait_css(page, "#login #token")[0]
    field.send_keys(tenant_tokens[0])
    page.find_element(By.CSS_SELECTOR, "#login button[type=submit]").click()
    wait_css(page, "#jobs")
    assert page_errors(page, allowed=("401",)) == []
