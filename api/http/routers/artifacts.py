"""What a job leaves behind: events, per-step metrics, logs, checkpoints and the exported model."""

from __future__ import annotations

import asyncio
import posixpath
from collections.abc import Iterator
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import PlainTextResponse, StreamingResponse

from api.http.deps import PlaneDep, Principal, PrincipalDep, SessionDep, job_or_404
from api.http.errors import ApiError
from api.http.schemas import checkpoint_out, event_out, metric_out
from service import job_queries
from service.control import ControlPlane
from service.db.repository import metric_stride
from service.job_logs import JobLog, job_log
from workers.parallel.pipeline.bubble import spec_theoretical_bubble
from workers.spec import JobSpec
from workers.storage import Storage

router = APIRouter(prefix="/v1/jobs/{job_id}", tags=["job artefacts"])
FOLLOW_POLL_S = 0.5
FOLLOW_MAX_S = 6 * 3600
CHECKPOINTS, MODEL = "checkpoints", "model.safetensors"  # in the job's storage (workers/checkpointing.py)
MODEL_CHUNK = 1 << 20  # a download is read from the store in pieces of this size, never whole


@router.get("/events")
def events(job_id: str, s: SessionDep, principal: PrincipalDep,
           after: Annotated[int, Query(ge=0, description="only events with a larger id")] = 0,
           limit: Annotated[int, Query(ge=1, le=10_000)] = 1000) -> dict:
    job_or_404(s, job_id, principal)
    return {"job_id": job_id, "events": [event_out(e) for e in job_queries.list_events(s, job_id, after, limit)]}


@router.get("/metrics")
def metrics(job_id: str, plane: PlaneDep, s: SessionDep, principal: PrincipalDep,
            after_step: Annotated[int, Query(ge=0)] = 0,
            limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000) -> dict:
    job = job_or_404(s, job_id, principal)
    # The schedule's ideal bubble beside each measured one, so a user sees measured vs ideal per step.
    theory = spec_theoretical_bubble(JobSpec.model_validate(job.spec))
    points = [metric_out(m) for m in job_queries.list_metrics(s, job_id, after_step, limit)]
    for point in points:
        point["bubble_fraction_theoretical"] = theory if point["bubble_fraction"] is not None else None
    return {"job_id": job_id, "total_steps": job.total_steps, "bubble_fraction_theoretical": theory,
            "stride": metric_stride(job.total_steps, plane.settings.metrics_max_points), "points": points}


def _log_file(job, rank: str) -> str:
    if rank == "supervisor":
        return "supervisor.log"
    if not rank.isdigit() or int(rank) >= job.world_size:
        msg = f"rank: must be 'supervisor' or an integer in [0, {job.world_size - 1}] (got {rank!r})"
        raise ApiError(422, msg, [{"field": "rank", "message": msg}])
    return f"rank-{int(rank)}.log"


@router.get("/logs")
async def logs(job_id: str, plane: PlaneDep, principal: PrincipalDep,
               rank: Annotated[str, Query(description="a rank number or 'supervisor'")] = "0",
               tail: Annotated[int, Query(ge=0, le=100_000)] = 200,
               follow: Annotated[bool, Query(description="keep streaming until the job ends")] = False):
    job = await run_in_threadpool(_owned_job, plane, job_id, principal)
    log = job_log(plane.settings.job_storage(job.id), _log_file(job, rank))
    text = await run_in_threadpool(log.tail, tail)
    if not follow:
        return PlainTextResponse(text)
    return StreamingResponse(_follow(plane, job_id, log, text), media_type="text/plain")


async def _follow(plane: ControlPlane, job_id: str, log: JobLog, first: str):
    yield first
    loop = asyncio.get_running_loop()
    deadline = loop.time() + FOLLOW_MAX_S
    while loop.time() < deadline:
        chunk = await run_in_threadpool(log.read_more)
        if chunk:
            yield chunk.decode(errors="replace")
            continue
        if await run_in_threadpool(_ended, plane, job_id):
            # Ended: what its processes shipped on their way out is the rest of the log.
            if not (rest := await run_in_threadpool(log.read_more)):
                return
            yield rest.decode(errors="replace")
            continue
        await asyncio.sleep(FOLLOW_POLL_S)


def _ended(plane: ControlPlane, job_id: str) -> bool:
    with plane.sessions() as s:
        return job_queries.job_ended(s, job_id)


def _owned_job(plane: ControlPlane, job_id: str, principal: Principal):
    with plane.sessions() as s:
        return job_or_404(s, job_id, principal)


@router.get("/checkpoints")
def checkpoints(job_id: str, plane: PlaneDep, s: SessionDep, principal: PrincipalDep) -> dict:
    job = job_or_404(s, job_id, principal)
    store = plane.settings.job_storage(job.id)
    stored = set(store.list(CHECKPOINTS))  # one listing of the store, not a request per checkpoint
    listed = {c.step: checkpoint_out(c, posixpath.basename(c.path.rstrip("/")) in stored)
              for c in job_queries.list_checkpoints(s, job.id)}
    for name in sorted(stored):  # in the store but not reported (yet)
        step = int(name.removeprefix("step-")) if name.removeprefix("step-").isdigit() else None
        if step is not None and step not in listed:
            listed[step] = {"step": step, "path": store.url(f"{CHECKPOINTS}/{name}"), "created_at": None,
                            "available": True}
    size = _model_size(store)
    return {
        "job_id": job.id,
        "checkpoints": [listed[step] for step in sorted(listed)],
        "model": {"available": size is not None, "bytes": size, "download": f"/v1/jobs/{job.id}/checkpoints/model"},
    }


@router.get("/checkpoints/model")
def download_model(job_id: str, plane: PlaneDep, s: SessionDep, principal: PrincipalDep) -> StreamingResponse:
    """The exported final model (safetensors), for the job's owner, streamed from the store."""
    job = job_or_404(s, job_id, principal)
    store = plane.settings.job_storage(job.id)
    size = _model_size(store)
    if size is None:
        raise ApiError(404, f"job {job.id!r} has no exported model "
                            f"(state {job.state}; it is written when training succeeds)")
    filename = f"{job.name}-{job.id}.safetensors"
    return StreamingResponse(_stream(store, MODEL), media_type="application/octet-stream", headers={
        "Content-Length": str(size), "Content-Disposition": f'attachment; filename="{filename}"'})


def _model_size(store: Storage) -> int | None:
    try:
        return store.size(MODEL)
    except FileNotFoundError:
        return None


def _stream(store: Storage, rel: str) -> Iterator[bytes]:
    # A sync generator: Starlette runs each read in its threadpool, so a slow store blocks no request.
    with store.open(rel) as f:
        while chunk := f.read(MODEL_CHUNK):
            yield chunk
