"""Driving the console like a user: open a page logged in, wait for what it draws, read its console log."""

from __future__ import annotations

import time

from selenium.common.exceptions import NoAlertPresentException, StaleElementReferenceException
from selenium.webdriver.common.by import By


def open_logged_in(driver, base_url: str, path: str, token: str) -> None:
    """Log in the scripted way: the token in the URL fragment."""
    driver.get(f"{base_url}{path}#token={token}")


def wait_css(driver, selector: str, timeout: float = 20, count: int = 1) -> list:
    """At least `count` elements matching `selector`, once the page drew them."""
    deadline = time.monotonic() + timeout
    while True:
        found = driver.find_elements(By.CSS_SELECTOR, selector)
        if len(found) >= count:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{selector!r}: {len(found)} element(s) after {timeout}s, wanted {count};\n"
                                 f"page text: {driver.find_element(By.TAG_NAME, 'body').text[:1500]}")
        time.sleep(0.2)


def wait_text(driver, selector: str, predicate, timeout: float = 20) -> str:
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        found = driver.find_elements(By.CSS_SELECTOR, selector)
        try:
            text = found[0].text if found else ""
        except StaleElementReferenceException:  # redrawn between finding and reading: read the new one
            continue
        if found and predicate(text):
            return text
        time.sleep(0.2)
    raise AssertionError(f"{selector!r} text never matched; last: {text!r}")


# The jobs page asks GET /v1/tenants once per token to learn whether it is an admin's (jobs.js); Chromium
# logs the 403 a tenant's token gets as a failed load. That refusal is the answer, not an error of the page.
ADMIN_PROBE = "/v1/tenants - Failed to load resource: the server responded with a status of 403"


def page_errors(driver, allowed: tuple[str, ...] = ()) -> list[str]:
    """The browser console's errors (a script error, a CSP refusal), except the HTTP statuses a test expects
    and the jobs page's admin probe."""
    errors = []
    for entry in driver.get_log("browser"):
        message = entry["message"]
        if entry["level"] == "SEVERE" and not any(a in message for a in (*allowed, ADMIN_PROBE)):
            errors.append(message)
    return errors


def no_alert(driver) -> bool:
    try:
        driver.switch_to.alert
    except NoAlertPresentException:
        return True
    return False


def click_css(driver, selector: str, timeout: float = 20) -> None:
    """Click the element, again if a refresh redrew it between finding and clicking (lists redraw every ~3 s)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            wait_css(driver, selector, timeout)[0].click()
            return
        except StaleElementReferenceException:
            if time.monotonic() > deadline:
                raise
