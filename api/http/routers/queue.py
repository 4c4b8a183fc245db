"""The fair scheduler's queue and the cluster it admits onto (read scope): GET /v1/queue, GET /v1/cluster."""

from __future__ import annotations

import httpx
from fastapi import APIRouter, Request

from api.http.deps import PlaneDep, PrincipalDep
from api.http.errors import ApiError
from api.http.schemas import cluster_out, queue_out
from service.queue_view import queue_view
from service.queueing import Resources

router = APIRouter(prefix="/v1", tags=["queue"])
PRIMARY_TIMEOUT_S = 10.0  # an API worker asks the primary, the one process that talks to the cluster


@router.get("/queue")
def get_queue(plane: PlaneDep, principal: PrincipalDep) -> dict:
    """Each tenant's weight, fair share, running workers, queued jobs and reservation; a token that is
    not an admin's sees its own tenant only."""
    total = (plane.capacity or ({}, {}))[0]
    with plane.sessions() as s:
        tenants = queue_view(s, Resources(total.get("CPU", 0.0), total.get("GPU", 0.0)),
                             None if principal.is_admin else principal.tenant_id)
    return queue_out(plane.settings.reserve_after_s, tenants)


@router.get("/cluster")
def get_cluster(plane: PlaneDep, request: Request) -> dict:
    """The cluster's nodes, each with what it has in all and free now, and the sums over live nodes."""
    if plane.api_only:  # only the primary is connected to the cluster: it answers for us
        assert plane.shared is not None, "an API worker is always given the primary's shared state"
        try:
            upstream = httpx.get(f"{plane.shared.primary_url}/v1/cluster", timeout=PRIMARY_TIMEOUT_S,
                                 headers={"authorization": request.headers.get("authorization", "")})
        except httpx.TransportError as exc:
            raise ApiError(503, f"the primary process did not answer: {type(exc).__name__}") from exc
        if upstream.status_code != 200:
            raise ApiError(upstream.status_code, upstream.json().get("detail", upstream.text))
        return upstream.json()
    if not plane.ray_ready.is_set():
        raise ApiError(503, f"the cluster is not connected yet: {plane.ray_error or 'connecting'}")
    return cluster_out(plane.cluster.nodes(), plane.cluster.available_per_node())
