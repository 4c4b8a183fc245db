"""What a job leaves behind: events, per-step metrics, logs, checkpoints and the exported model."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, PlainTextResponse, StreamingResponse

from api.http.deps import PlaneDep, Principal, PrincipalDep, SessionDep, job_or_404
from api.http.errors import ApiError
from api.http.schemas import checkpoint_out, event_out, metric_out
from service import job_queries
from service.control import ControlPlane
from service.db.repository import metric_stride
from service.log_tail import tail_file
from workers.parallel.pipeline.bubble import spec_theoretical_bubble
from workers.spec import JobSpec

router = APIRouter(prefix="/v1/jobs/{job_id}", tags=["job artefacts"])
FOLLOW_POLL_S = 0.5
FOLLOW_MAX_S = 6 * 3600


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


def _log_path(plane: ControlPlane, job, rank: str) -> Path:
    logs = plane.settings.job_dir(job.id) / "logs"
    if rank == "supervisor":
        return logs / "supervisor.log"
    if not rank.isdigit() or int(rank) >= job.world_size:
        msg = f"rank: must be 'supervisor' or an integer in [0, {job.world_size - 1}] (got {rank!r})"
        raise ApiError(422, msg, [{"field": "rank", "message": msg}])
    return logs / f"rank-{int(rank)}.log"


@router.get("/logs")
async def logs(job_id: str, plane: PlaneDep, principal: PrincipalDep,
               rank: Annotated[str, Query(description="a rank number or 'supervisor'")] = "0",
               tail: Annotated[int, Query(ge=0, le=100_000)] = 200,
               follow: Annotated[bool, Query(description="keep streaming until the job ends")] = False):
    job = await run_in_threadpool(_owned_job, plane, job_id, principal)
    path = _log_path(plane, job, rank)
    text, offset = await run_in_threadpool(tail_file, path, tail)
    if not follow:
        return PlainTextResponse(text)
    return StreamingResponse(_follow(plane, job_id, path, text, offset), media_type="text/plain")


async def _follow(plane: ControlPlane, job_id: str, path: Path, first: str, offset: int):
    yield first
    loop = asyncio.get_running_loop()
    deadline = loop.time() + FOLLOW_MAX_S
    while loop.time() < deadline:
        chunk = await run_in_threadpool(_read_from, path, offset)
        if chunk:
            offset += len(chunk)
            yield chunk.decode(errors="replace")
            continue
        if await run_in_threadpool(_ended, plane, job_id):
            if not await run_in_threadpool(_read_from, path, offset):
                return
            continue
        await asyncio.sleep(FOLLOW_POLL_S)


def _read_from(path: Path, offset: int) -> bytes:
    if not path.exists():
        return b""
    with path.open("rb") as f:
        f.seek(offset)
        return f.read(1 << 20)


def _ended(plane: ControlPlane, job_id: str) -> bool:
    with plane.sessions() as s:
        return job_queries.job_ended(s, job_id)


def _owned_job(plane: ControlPlane, job_id: str, principal: Principal):
    with plane.sessions() as s:
        return job_or_404(s, job_id, principal)


@router.get("/checkpoints")
def checkpoints(job_id: str, plane: PlaneDep, s: SessionDep, principal: PrincipalDep) -> dict:
    job = job_or_404(s, job_id, principal)
    listed = {c.step: checkpoint_out(c, Path(c.path).exists()) for c in job_queries.list_checkpoints(s, job.id)}
    ckpt_dir = plane.settings.job_dir(job.id) / "checkpoints"
    for path in sorted(ckpt_dir.glob("step-*")) if ckpt_dir.is_dir() else []:  # on disk but not reported (yet)
        step = int(path.name.removeprefix("step-")) if path.name.removeprefix("step-").isdigit() else None
        if step is not None and step not in listed:
            listed[step] = {"step": step, "path": str(path), "created_at": None, "available": True}
    model = plane.settings.job_dir(job.id) / "model.safetensors"
    return {
        "job_id": job.id,
        "checkpoints": [listed[step] for step in sorted(listed)],
        "model": {"available": model.exists(), "bytes": model.stat().st_size if model.exists() else None,
                  "download": f"/v1/jobs/{job.id}/checkpoints/model"},
    }


@router.get("/checkpoints/model")
def download_model(job_id: str, plane: PlaneDep, s: SessionDep, principal: PrincipalDep) -> FileResponse:
    """The exported final model (safetensors), for the job's owner."""
    job = job_or_404(s, job_id, principal)
    model = plane.settings.job_dir(job.id) / "model.safetensors"
    if not model.exists():
        raise ApiError(404, f"job {job.id!r} has no exported model "
                            f"(state {job.state}; it is written when training succeeds)")
    return FileResponse(model, media_type="application/octet-stream", filename=f"{job.name}-{job.id}.safetensors")
