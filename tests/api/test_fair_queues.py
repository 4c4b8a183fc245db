"""A tenant's fair-share fields over REST (scheduler paused), on SQLite and PostgreSQL: weight and
reserve_after_s set, patched, listed; bad values are 422s that name the field and the rule, and
store nothing."""

from __future__ import annotations

import uuid

import pytest

from tests.api.test_bad_input import _fails
from tests.api.test_tenancy import new_tenant


def test_weight_and_reserve_after_s_are_set_patched_and_listed(queue_server):
    tenant, _ = new_tenant(queue_server, weight=2.5, reserve_after_s=30)
    assert (tenant["weight"], tenant["reserve_after_s"]) == (2.5, 30)
    plain, _ = new_tenant(queue_server)
    assert (plain["weight"], plain["reserve_after_s"]) == (1.0, None)  # the server's reserve_after_s
    with queue_server.client() as admin:
        patched = admin.patch(f"/v1/tenants/{tenant['name']}", json={"weight": 4}).json()
        assert (patched["weight"], patched["reserve_after_s"]) == (4.0, 30)  # only what was sent changes
        patched = admin.patch(f"/v1/tenants/{tenant['id']}", json={"reserve_after_s": None}).json()
        assert (patched["weight"], patched["reserve_after_s"]) == (4.0, None)
        listed = {t["id"]: t for t in admin.get("/v1/tenants").json()["tenants"]}
        got = admin.get(f"/v1/tenants/{tenant['id']}").json()
    assert listed[tenant["id"]]["weight"] == got["weight"] == 4.0
    assert listed[plain["id"]]["weight"] == 1.0 and got["reserve_after_s"] is None


BAD = [
    ({"weight": 0}, "weight", "greater than 0"),
    ({"weight": -2}, "weight", "greater than 0"),
    ({"weight": "heavy"}, "weight", "valid number"),
    ({"weight": "2"}, "weight", "valid number"),  # a number, not text that looks like one
    ({"weight": True}, "weight", "valid number"),
    ({"weight": None}, "weight", "valid number"),
    ({"reserve_after_s": -1}, "reserve_after_s", "greater than or equal to 0"),
    ({"reserve_after_s": "soon"}, "reserve_after_s", "valid number"),
]


@pytest.mark.parametrize("body, field, rule", BAD, ids=[f"{f}={b[f]!r}" for b, f, _ in BAD])
def test_a_bad_weight_or_reserve_after_s_is_a_422_naming_it_and_nothing_is_stored(queue_server, counts, body, field,
                                                                                  rule):
    tenant, _ = new_tenant(queue_server, weight=3, reserve_after_s=10)
    before = counts()
    name = f"t-{uuid.uuid4().hex[:8]}"
    with queue_server.client() as admin:
        failed = _fails(admin.post("/v1/tenants", json={"name": name, **body}), 422, rule)
        assert failed["errors"][0]["field"] == field and failed["detail"].startswith(f"{field}: ")
        _fails(admin.patch(f"/v1/tenants/{tenant['id']}", json={"weight": 5, **body}), 422, field, rule)
        assert admin.get(f"/v1/tenants/{name}").status_code == 404
        kept = admin.get(f"/v1/tenants/{tenant['id']}").json()
    assert (kept["weight"], kept["reserve_after_s"]) == (3.0, 10.0)  # the valid weight beside it is not stored
    assert counts() == before
