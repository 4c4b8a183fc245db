"""A supervisor asks for the supervisors' own resource (TRAINYARD_SUPERVISOR_RESOURCE) and its
reserved memory, on a real Ray: where no node has the resource it does not start anywhere else."""

from __future__ import annotations

import uuid

import pytest
import ray

from service.supervisor.actor import create_supervisor


def test_a_supervisor_runs_only_where_its_resource_is(ray_cluster):
    absent = create_supervisor(f"test-placement-{uuid.uuid4().hex[:8]}", resource="no-node-has-this")
    placed = create_supervisor(f"test-placement-{uuid.uuid4().hex[:8]}", memory_mb=64)
    try:
        assert ray.get(placed.ready.remote(), timeout=60) is True  # memory reserved, no resource asked
        with pytest.raises(ray.exceptions.GetTimeoutError):
            ray.get(absent.ready.remote(), timeout=3)  # pending: no node offers its resource
    finally:
        for handle in (absent, placed):
            ray.kill(handle, no_restart=True)
