"""Submitting, listing, reading and cancelling jobs."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api import gates
from api.audit import audit_record
from api.deps import (
    PlaneDep,
    Principal,
    PrincipalDep,
    SessionDep,
    job_not_found,
    job_or_404,
)
from api.errors import ApiError
from api.responses import FastJSONResponse
from api.schemas import job_out
from service import quotas
from service.control import ControlPlane
from service.db import repository as repo
from service.db.models import Job
from service.lifecycle import JobState
from service.scheduler import demand_of, never_fits
from workers.spec import JobSpec
from workers.spec_loading import parse_spec

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


def _decode(body: bytes) -> dict:
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(422, f"body: malformed JSON ({exc})", [{"field": "body", "message": f"body: malformed JSON ({exc})"}])
    if not isinstance(data, dict):
        msg = f"body: a job spec must be a JSON object, got {type(data).__name__}"
        raise ApiError(422, msg, [{"field": "body", "message": msg}])
    return data


@router.post("", status_code=201, openapi_extra={
    "requestBody": {"required": True, "content": {"application/json": {"schema": JobSpec.model_json_schema()}}}})
async def submit_job(
    request: Request, plane: PlaneDep, principal: PrincipalDep,
    priority: Annotated[int, Query(ge=-1000, le=1000, description="higher starts first")] = 0,
    idempotency_key: Annotated[str | None, Header(min_length=1, max_length=128)] = None,
) -> FastJSONResponse:
    """Validate a JobSpec and queue it. The same Idempotency-Key and body return the same job.
    403: user code or fault injection the tenant or token may not use; 429: over a quota."""
    data = _decode(await request.body())
    gates.check_fault_injection_scope(data, principal.scopes)
    spec = parse_spec(data, allow_fault_injection=plane.settings.allow_fault_injection)  # 422 on any rule
    if plane.capacity is not None and (why := never_fits(demand_of(spec), *plane.capacity)):
        raise ApiError(422, f"the job can never run on this cluster: {why}", [{"field": "resources", "message": why}])
    canonical = json.dumps({"spec": spec.model_dump(mode="json"), "priority": priority}, sort_keys=True)
    body_sha = hashlib.sha256(canonical.encode()).hexdigest()
    write = _store(plane, principal, spec, priority, body_sha, idempotency_key)
    for _ in range(2):
        try:
            job, created = await asyncio.wrap_future(plane.writes.submit(
                write, lock_order=principal.tenant_id, hint=(principal.tenant_id, idempotency_key)))
            break
        except IntegrityError:  # the same key, committed meanwhile by another process: read its job
            if idempotency_key is None:
                raise
    else:
        raise ApiError(409, "idempotency-key: concurrent submits with this key; retry")
    job = job_out(job)  # after commit: the row's defaults are filled in
    request.state.audited = True  # with the job, in its transaction
    if created:
        plane.wake.set()
    return FastJSONResponse(job, status_code=201, headers={"Location": f"/v1/jobs/{job['id']}",
                                                           "Idempotent-Replayed": "false" if created else "true"})


def _store(plane: ControlPlane, principal: Principal, spec: JobSpec, priority: int, body_sha: str,
           key: str | None) -> Callable[[Session], tuple[Job, bool]]:
    """The submit's write, run with other submits in one transaction (service/db/group_commit.py):
    every check first, then the insert and the call's audit record (201; a refusal is audited by
    api/audit.py)."""
    limit = plane.settings.max_active_jobs_per_tenant

    def audited(job_id: str) -> dict:  # a submit's audit record commits with it (one commit, not two)
        return audit_record(principal, "POST", "/v1/jobs", 201, job_id, target_tenant_id=principal.tenant_id)

    def write(s: Session) -> tuple[Job, bool]:
        if key is not None and (existing := repo.find_by_idempotency_key(s, principal.tenant_id, key)):
            if existing.body_sha256 != body_sha:
                raise repo.IdempotencyConflict(
                    "idempotency-key: already used for a different job spec or priority; use a new key")
            repo.add_audit(s, **audited(existing.id))
            return existing, False
        # Quotas are checked under the tenant's row lock, so concurrent submits (on any replica)
        # cannot both take the last place.
        tenant, usage = quotas.locked_usage(s, principal.tenant_id)
        gates.check_user_code(spec, tenant)
        confined = gates.confine_paths(spec, plane.settings.storage_root,
                                       lambda job_id: repo.get_job(s, job_id, tenant_id=tenant.id) is not None)
        if usage.open_jobs >= limit:
            raise repo.QuotaExceeded(repo.quota_message(limit))
        try:
            quotas.check_submit(tenant, usage, confined.world_size)
        except quotas.NeverWithinQuota as exc:
            raise ApiError(422, str(exc), [{"field": "resources.workers", "message": str(exc)}]) from None
        job = repo.create_job(s, tenant.id, confined, priority, body_sha, key, max_open_jobs=None)
        usage.add_queued(confined.world_size)
        repo.add_audit(s, **audited(job.id))
        return job, True

    return write


@router.get("")
def list_jobs(
    s: SessionDep, principal: PrincipalDep,
    state: Annotated[JobState | None, Query(description="only jobs in this state")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100, offset: Annotated[int, Query(ge=0)] = 0,
) -> dict:
    jobs = repo.list_jobs(s, principal.tenant_id, state, limit, offset)
    return {"jobs": [job_out(j, full=False) for j in jobs], "limit": limit, "offset": offset}


@router.get("/{job_id}")
async def get_job(job_id: str, plane: PlaneDep, principal: PrincipalDep) -> FastJSONResponse:
    return FastJSONResponse(await run_in_threadpool(_read_job, plane, job_id, principal))


def _read_job(plane: ControlPlane, job_id: str, principal: Principal) -> dict:
    """Usually answered by api/job_read_fast_path.py; here when it steps aside (a token not yet in
    the cache, a job that is not the caller's, ...), with the same reader."""
    row = plane.job_reader.read(job_id, principal.tenant_id)
    if row is None:
        raise job_not_found(job_id)
    return job_out(row)


@router.post("/{job_id}/cancel", status_code=202)
def cancel_job(job_id: str, plane: PlaneDep, principal: PrincipalDep) -> dict:
    """Stop a job: a queued one at once, a running one through its supervisor (poll until CANCELLED)."""
    with plane.sessions.begin() as s:
        job = job_or_404(s, job_id, principal)
        job = repo.get_job(s, job.id, lock=True)
        repo.request_cancel(s, job)  # 409 if the job already ended
        out = job_out(job)
    # The supervisor hears it from the reconciler's next tick anyway; the primary tells it now.
    if out["cancel_requested"] and not plane.api_only and plane.ray_ready.is_set():
        from service.supervisor.actor import find_supervisor

        handle = find_supervisor(out["supervisor"])
        if handle is not None:
            handle.cancel.remote()  # quicker than waiting for the reconciler's next tick
    return out
