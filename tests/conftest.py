"""Shared fixtures: a real local Ray for the tests that train."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """One real local Ray (8 logical CPUs on this 2-core machine) for the whole session."""
    import ray

    from service.ray_client import connect
    from service.settings import Settings

    connect(Settings(home=tmp_path_factory.mktemp("ray-home")))
    yield ray
    ray.shutdown()
