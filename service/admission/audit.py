"""The audit record of a call: who (tenant, token), what, on what, and how it ended.

Built here for every state-changing call: by admission for a submit (committed in the
submit's own transaction: one commit for the job and its record) and by the API's audit
middleware for the others (api/http/audit.py).
"""

from __future__ import annotations

from concurrent.futures import Future

from service.db import audit_log as audit_repo
from service.db.group_commit import GroupCommit
from service.records import Principal

SUBMIT = "job.submit"


def outcome_of(status: int) -> str:
    if status < 400:
        return "ok"
    if status in (401, 403):
        return "denied"
    return "error" if status >= 500 else "rejected"


def audit_record(caller: Principal, action: str, status: int, target: str, detail: str = "",
                 target_tenant_id: str | None = None) -> dict:
    """The audit record's columns, cut to their widths."""
    return dict(tenant_id=caller.tenant_id, token_id=caller.token_id, token_name=caller.token_name,
                action=action[:32], target=str(target)[:128] or None, target_tenant_id=target_tenant_id,
                status=status, outcome=outcome_of(status), detail=detail)


def write_audit(writes: GroupCommit, record: dict) -> Future:
    """Commit one record with other requests' records and submits (service/db/group_commit.py)."""
    return writes.submit(lambda s: audit_repo.add_audit(s, **record))
