"""Submitting, listing, reading and cancelling jobs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session

from api.http.deps import PlaneDep, Principal, PrincipalDep, SessionDep, job_not_found
from api.http.errors import ApiError
from api.http.responses import FastJSONResponse
from api.http.schemas import job_out
from api.http.spec_body import decode_spec_body
from service import job_queries, tenancy
from service.admission.submit import Submission
from service.control import ControlPlane
from service.lifecycle import JobState
from workers.spec import JobSpec

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


@router.post("", status_code=201, openapi_extra={
    "requestBody": {"required": True, "content": {"application/json": {"schema": JobSpec.model_json_schema()}}}})
async def submit_job(
    request: Request, plane: PlaneDep, principal: PrincipalDep,
    priority: Annotated[int, Query(ge=-1000, le=1000, description="higher starts first")] = 0,
    idempotency_key: Annotated[str | None, Header(min_length=1, max_length=128)] = None,
) -> FastJSONResponse:
    """Validate a JobSpec and queue it. The same Idempotency-Key and body return the same job.
    403: user code or fault injection the tenant or token may not use; 429: over a quota."""
    body = decode_spec_body(await request.body())
    # Every check, the insert and the call's audit record (a refusal is audited by api/http/audit.py).
    admitted = await plane.admission.submit(Submission(principal, body, priority, idempotency_key))
    request.state.audited = True  # with the job, in its transaction
    # The memory check's figures (or that the model's peak is not predicted, and why): this answer only.
    job = {**job_out(admitted.job), "memory": admitted.memory}
    replayed = "false" if admitted.created else "true"
    return FastJSONResponse(job, status_code=201,
                            headers={"Location": f"/v1/jobs/{job['id']}", "Idempotent-Replayed": replayed})


@router.get("")
def list_jobs(
    s: SessionDep, principal: PrincipalDep,
    state: Annotated[JobState | None, Query(description="only jobs in this state")] = None,
    tenant: Annotated[str | None, Query(min_length=1, max_length=64, description=(
        "this tenant's jobs (id or name): any tenant with the admin scope, else only the token's own; "
        "an unknown tenant is a 404"))] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100, offset: Annotated[int, Query(ge=0)] = 0,
) -> dict:
    """The jobs of the token's tenant (or of `tenant`), newest first, a page of `limit` from `offset`."""
    tenant_id = principal.tenant_id if tenant is None else _listed_tenant(s, principal, tenant)
    jobs = job_queries.list_jobs(s, tenant_id, state, limit, offset)
    return {"jobs": [job_out(j, full=False) for j in jobs], "tenant": tenant_id, "limit": limit, "offset": offset}


def _listed_tenant(s: Session, principal: Principal, tenant: str) -> str:
    """The id of the tenant whose jobs `?tenant=` asks for. A token without the admin scope may name only
    its own tenant: any other name (one that exists or not) is the same 403, so it learns nothing."""
    found = tenancy.find_tenant(s, tenant)
    if found is not None and found.id == principal.tenant_id:
        return found.id
    if not principal.is_admin:
        msg = "tenant: listing another tenant's jobs needs the 'admin' scope"
        raise ApiError(403, msg, [{"field": "tenant", "message": msg}])
    if found is None:
        msg = f"tenant: tenant {tenant!r} not found"
        raise ApiError(404, msg, [{"field": "tenant", "message": msg}])
    return found.id


@router.get("/{job_id}")
async def get_job(job_id: str, plane: PlaneDep, principal: PrincipalDep) -> FastJSONResponse:
    return FastJSONResponse(await run_in_threadpool(_read_job, plane, job_id, principal))


def _read_job(plane: ControlPlane, job_id: str, principal: Principal) -> dict:
    """Usually answered by api/http/job_read_fast_path.py; here when it steps aside (a token not yet
    in the cache, a job that is not the caller's, ...), with the same reader."""
    row = plane.job_reader.read(job_id, principal.tenant_id)
    if row is None:
        raise job_not_found(job_id)
    return job_out(row)


@router.post("/{job_id}/cancel", status_code=202)
def cancel_job(job_id: str, plane: PlaneDep, principal: PrincipalDep) -> dict:
    """Stop a job: a queued one at once, a running one through its supervisor (poll until CANCELLED)."""
    with plane.sessions.begin() as s:
        job = job_queries.cancel_job(s, job_id, principal.tenant_id)  # 409 if the job already ended
        if job is None:
            raise job_not_found(job_id)
        out = job_out(job)
    # The supervisor hears it from the reconciler's next tick anyway; the primary tells it now.
    if out["cancel_requested"] and not plane.api_only and plane.ray_ready.is_set():
        from service.supervisor.actor import find_supervisor

        handle = find_supervisor(out["supervisor"])
        if handle is not None:
            handle.cancel.remote()  # quicker than waiting for the reconciler's next tick
    return out
