"""The queue and cluster page draws GET /v1/queue (each tenant's weight, fair share, running workers,
queued jobs, reservation) and GET /v1/cluster (the local Ray's nodes with total and free resources)
from the user's own token: the same figures the REST calls return."""

from __future__ import annotations

import httpx
import pytest
from selenium.webdriver.common.by import By

from tests.console.browsing import open_logged_in, page_errors, wait_css

pytestmark = pytest.mark.slow


def test_queue_page_shows_the_tenants_share_and_the_clusters_nodes(page, console_server, tenant_tokens):
    with httpx.Client(base_url=console_server.url, headers={"Authorization": f"Bearer {tenant_tokens[0]}"}) as c:
        queue, cluster = c.get("/v1/queue").json(), c.get("/v1/cluster").json()
    assert queue["tenants"] and cluster["nodes"], (queue, cluster)
    open_logged_in(page, console_server.url, "/ui/queue", tenant_tokens[0])
    rows = wait_css(page, "#queue tbody tr", count=len(queue["tenants"]))
    cells = [[td.text for td in row.find_elements(By.TAG_NAME, "td")] for row in rows]
    assert sorted(c[0] for c in cells) == sorted(t["tenant"] for t in queue["tenants"])  # a tenant sees its own
    nodes = wait_css(page, "#nodes tbody tr", count=len(cluster["nodes"]))
    shown = {row.find_elements(By.TAG_NAME, "td")[0].text for row in nodes}
    assert shown == {n["node"] for n in cluster["nodes"]}
    assert "CPU" in page.find_element(By.CSS_SELECTOR, "#cluster-box").text
    assert page_errors(page) == []
