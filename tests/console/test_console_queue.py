"""The queue and cluster page: on a service without GET /v1/queue and /v1/cluster (another branch adds
them) it says so plainly instead of failing."""

from __future__ import annotations

import httpx
import pytest

from tests.console.browsing import open_logged_in, page_errors, wait_text

pytestmark = pytest.mark.slow


def test_queue_page_says_when_the_service_lacks_the_endpoints(page, console_server, tenant_tokens):
    with httpx.Client(base_url=console_server.url, headers={"Authorization": f"Bearer {tenant_tokens[0]}"}) as c:
        offered = {path: c.get(path).status_code for path in ("/v1/queue", "/v1/cluster")}
    open_logged_in(page, console_server.url, "/ui/queue", tenant_tokens[0])
    for path, box in (("/v1/queue", "#queue-box"), ("/v1/cluster", "#cluster-box")):
        if offered[path] == 404:
            assert f"does not offer {path} (404)" in wait_text(page, box, lambda t: "404" in t)
        else:  # the endpoints have landed: their tables are drawn
            wait_text(page, box, lambda t: len(t) > 0 and "404" not in t)
    assert page_errors(page, allowed=("404",)) == []
