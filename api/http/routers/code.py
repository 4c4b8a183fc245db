"""Uploading a program's code: its working_dir as a zip, stored by content hash (service/code_store.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from api.http.deps import PlaneDep, Principal, PrincipalDep
from api.http.error_schema import ErrorOut
from api.http.errors import ApiError
from service import tenancy
from service.admission import gates
from service.code_store import CodeStore, StoredCode
from service.control import ControlPlane

PATH = "/v1/code"
router = APIRouter(prefix=PATH, tags=["code"])
MEDIA_TYPE = "application/zip"
WRITE_CHUNK = 1 << 20  # the body reaches the disk in pieces of about this size; never whole in memory
MIN_UPLOAD_BYTES_PER_S = 1 << 20  # an upload may take read_timeout_s plus its size at this rate (else 408)


class CodeOut(BaseModel):
    ref: str = Field(description="the value for program.working_dir: 'code:<sha256>'")
    sha256: str = Field(description="sha256 of the zip, hex")
    bytes: int = Field(description="size of the zip")
    created: bool = Field(description="false: this content was stored before (the answer is then 200, not 201)")


@router.post("", status_code=201, response_model=CodeOut, responses={
    200: {"model": CodeOut, "description": "the same content was stored before: the same reference"},
    415: {"model": ErrorOut, "description": f"the body is not sent as {MEDIA_TYPE}"},
}, openapi_extra={"requestBody": {"required": True, "content": {
    MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}}}})
async def upload_code(request: Request, plane: PlaneDep, principal: PrincipalDep) -> JSONResponse:
    """Store a program's working_dir, zipped; use the answer's `ref` as `program.working_dir`.
    201 when new, 200 for content stored before (uploads are idempotent by content).
    403: the tenant may not run user code; 413: over TRAINYARD_MAX_CODE_BYTES; 422: not a zip, or
    an entry with an absolute path, a '..' or a symlink."""
    media_type = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media_type != MEDIA_TYPE:
        msg = f"content-type: must be {MEDIA_TYPE} (a zip of the working_dir), got {media_type or 'none'!r}"
        raise ApiError(415, msg, [{"field": "content-type", "message": msg}])
    await run_in_threadpool(_may_upload, plane, principal)  # before reading a body it would refuse
    stored = await _receive(request, CodeStore(plane.settings.storage, plane.settings.max_code_bytes))
    request.state.audit_target, request.state.audit_target_tenant = stored.ref, principal.tenant_id
    out = CodeOut(ref=stored.ref, sha256=stored.sha256, bytes=stored.size, created=stored.created)
    return JSONResponse(out.model_dump(), status_code=201 if stored.created else 200)


def _may_upload(plane: ControlPlane, principal: Principal) -> None:
    with plane.sessions() as s:
        tenant = tenancy.find_tenant(s, principal.tenant_id)
    if tenant is None:  # deleted since its token was cached
        raise ApiError(403, f"tenant {principal.tenant_id!r} no longer exists")
    gates.check_code_upload(tenant)


async def _receive(request: Request, store: CodeStore) -> StoredCode:
    """The body streamed to the store's temporary file, then checked and stored."""
    upload = await run_in_threadpool(store.begin)
    try:
        pending = bytearray()
        async for chunk in request.stream():
            pending += chunk
            if len(pending) >= WRITE_CHUNK:
                full, pending = pending, bytearray()
                await run_in_threadpool(upload.write, full)
        if pending:
            await run_in_threadpool(upload.write, pending)
        return await run_in_threadpool(upload.finish)
    finally:
        await run_in_threadpool(upload.discard)
