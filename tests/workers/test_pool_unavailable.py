"""A warm pool that cannot answer (restarting after its node was lost, unreachable, slow) gives no
warm workers, and the group starts fresh ones, instead of failing (found by the soak: after a node
loss, 6 jobs used up their restarts on ActorUnavailableError from the pool and FAILED)."""

from __future__ import annotations

import pytest
import ray

from workers.runtime import pool as pool_module


class _Pool:
    class take:  # noqa: N801 - shaped like an actor method
        @staticmethod
        def remote(node_ids):
            return ("ref", tuple(node_ids))


@pytest.mark.parametrize("error", [
    ray.exceptions.ActorUnavailableError("The actor is temporarily unavailable: The actor is restarting.", None),
    ray.exceptions.RayActorError(),
    ray.exceptions.GetTimeoutError(),
])
def test_an_unavailable_pool_gives_no_warm_workers(monkeypatch, error):
    monkeypatch.setattr(pool_module, "find_pool", lambda: _Pool())

    def get(ref, timeout=None):
        raise error

    monkeypatch.setattr(pool_module.ray, "get", get)
    assert pool_module.take_warm(["node-a", "node-b"]) == [None, None]


def test_an_answering_pool_gives_its_names(monkeypatch):
    monkeypatch.setattr(pool_module, "find_pool", lambda: _Pool())
    monkeypatch.setattr(pool_module.ray, "get", lambda ref, timeout=None: ["warm-1", None])
    assert pool_module.take_warm(["node-a", "node-b"]) == ["warm-1", None]


def test_no_pool_gives_none(monkeypatch):
    monkeypatch.setattr(pool_module, "find_pool", lambda: None)
    assert pool_module.take_warm(["node-a"]) == [None]
