"""Dry-run layout planning: what `trainyard plan` prints, over REST."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool

from api.http.deps import PlaneDep, PrincipalDep
from api.http.spec_body import decode_spec_body
from workers.spec_loading import parse_spec

router = APIRouter(prefix="/v1/plans", tags=["plans"])


@router.post("")
async def create_plan(
    request: Request, plane: PlaneDep, principal: PrincipalDep,
    memory_gib: Annotated[float | None, Query(gt=0, description="per-worker memory budget; default "
                                                                "resources.memory_per_worker_gib")] = None,
) -> dict:
    """Every valid layout of the spec's workers with predicted per-rank model-state, activation and
    communication bytes per step and step cost, and the one `parallel: auto` would choose.
    The spec's own `parallel` block is ignored; nothing is queued."""
    data = decode_spec_body(await request.body())
    data.pop("parallel", None)
    result = await run_in_threadpool(_plan, data, memory_gib)
    if not result.candidates:  # no layout passes the rules: report the spec's own errors (422)
        parse_spec(data, allow_fault_injection=plane.settings.allow_fault_injection)
    return result.to_dict()


def _plan(data: dict, memory_gib: float | None):
    """The planner builds each model on the meta device to count it: torch loads on the first plan, in a
    worker thread, not when the API starts."""
    from workers.parallel.planner import plan

    return plan(data, memory_gib)
