"""The calls a program makes, and which session answers them.

In order: a session bound in this process (a `program.function`, called inside the rank's Ray
actor), else the rank's actor over a local socket (`TRAINYARD_SESSION_SOCKET`, a
`program.command`), else none: the program runs outside Trainyard.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

from trainyard.checkpoints import latest_checkpoint_in

SOCKET_ENV = "TRAINYARD_SESSION_SOCKET"
REPORT_EVERY_ENV = "TRAINYARD_REPORT_EVERY_S"  # seconds between a command rank's report batches (trainyard/channel.py)
CHECKPOINT_DIR_ENV = "TRAINYARD_CHECKPOINT_DIR"
MESH_ENV = "TRAINYARD_MESH"  # JSON MeshLayout (trainyard/device_mesh.py): the job's mesh, as the trainer's


class Session(Protocol):
    def report(self, metrics: dict[str, float], step: int | None) -> None: ...
    def should_stop(self) -> bool: ...


class _Outside:
    """No Trainyard around (plain torchrun): reporting goes nowhere and nothing asks to stop."""

    def report(self, metrics: dict[str, float], step: int | None) -> None:
        pass

    def should_stop(self) -> bool:
        return False


_bound: Session | None = None
_mesh: Any = None


def bind(session: Session | None) -> None:
    """Used by Trainyard's runner: the in-process session of a program.function rank."""
    global _bound, _mesh
    _bound, _mesh = session, None


def _session() -> Session:
    global _bound
    if _bound is None:
        path = os.environ.get(SOCKET_ENV)
        if path:
            from trainyard.channel import SEND_EVERY_S, SocketSession

            _bound = SocketSession(path, float(os.environ.get(REPORT_EVERY_ENV, SEND_EVERY_S)))
        else:
            _bound = _Outside()
    return _bound


def report(metrics: dict[str, float], step: int | None = None) -> None:
    """Record this rank's metrics of one step (call it on every rank, as in Ray Train). The job's
    series take rank 0's values; each rank's time between reports feeds straggler detection.
    `loss`, `samples_per_s` and `tokens_per_s` become the job's Prometheus series; other numeric
    keys appear in GET /v1/jobs/{id}/metrics. `step` defaults to the previous one plus one."""
    clean = {}
    for key, value in metrics.items():
        if not isinstance(key, str):
            raise TypeError(f"trainyard.report: metric names must be strings, got {key!r}")
        try:
            clean[key] = float(value)  # tensors with .item(), numpy scalars, ints
        except (TypeError, ValueError) as exc:
            raise TypeError(f"trainyard.report: metric {key!r} must be a number, got {type(value).__name__}") from exc
    _session().report(clean, None if step is None else int(step))


def should_stop() -> bool:
    """True once the job is being cancelled or preempted: save a checkpoint and return."""
    return _session().should_stop()


def checkpoint_dir() -> Path | str:
    """Where this job's checkpoints go: the same directory on every attempt (./checkpoints outside Trainyard).
    On an object store, a URI (`s3://...`): write to it with fsspec or DCP (checkpoint_id=the URI)."""
    where = os.environ.get(CHECKPOINT_DIR_ENV) or "checkpoints"
    if "://" in where:
        return where
    path = Path(where)
    path.mkdir(parents=True, exist_ok=True)
    return path


def latest_checkpoint() -> Path | str | None:
    """The newest complete checkpoint in checkpoint_dir(), or None (see trainyard/checkpoints.py)."""
    return latest_checkpoint_in(checkpoint_dir())


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def mesh() -> Any:
    """The job's DeviceMesh over the default process group (initialised for a program.function; a command
    initialises it itself first): the trainer's own mesh of the job's `parallel` degrees less its dimensions of
    size 1 (dp always), built by trainyard/device_mesh.py. Outside Trainyard: a 1-D `dp` mesh."""
    global _mesh
    if _mesh is None:
        from trainyard.device_mesh import MeshLayout, build_device_mesh

        text = os.environ.get(MESH_ENV)
        layout = MeshLayout.from_json(text) if text else MeshLayout((("dp", world_size()),))
        device = "cuda" if os.environ.get("CUDA_VISIBLE_DEVICES") and _cuda() else "cpu"
        _mesh = build_device_mesh(layout, device)
    return _mesh


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
