"""A token is trusted for auth_cache_s after its lookup; a submit in that window whose tenant is gone
(its rows deleted by an operator) is a 401 naming the authorization, not a 500, and stores nothing."""

from __future__ import annotations

import uuid

from sqlalchemy import delete, func, select

from service.db.models import ApiToken, Job, Tenant
from tests.helpers import tiny_spec


def test_a_cached_token_whose_tenant_is_gone_is_refused_with_401(client):
    made = client.post("/v1/tenants", json={"name": f"t-{uuid.uuid4().hex[:8]}"})
    assert made.status_code == 201, made.text
    token, tenant_id = made.json()["token"], made.json()["id"]
    auth = {"Authorization": f"Bearer {token}"}
    assert client.get("/v1/jobs", headers=auth).status_code == 200  # the principal is now cached
    plane = client.app.state.plane
    with plane.sessions() as s:
        s.execute(delete(ApiToken).where(ApiToken.tenant_id == tenant_id))
        s.execute(delete(Tenant).where(Tenant.id == tenant_id))
        s.commit()
    answer = client.post("/v1/jobs", json=tiny_spec(), headers=auth)
    assert answer.status_code == 401, answer.text
    assert answer.json()["errors"] == [{"field": "authorization",
                                        "message": "authorization: this token's tenant no longer exists"}]
    assert answer.headers["www-authenticate"] == "Bearer"
    with plane.sessions() as s:
        assert s.scalar(select(func.count()).select_from(Job).where(Job.tenant_id == tenant_id)) == 0
