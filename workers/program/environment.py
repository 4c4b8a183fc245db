"""The environment of one program rank: torchrun's variables, so an unmodified torchrun script
runs, plus Trainyard's own (the job, its checkpoint directory, the attempt, the session socket)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from trainyard.device_mesh import MeshLayout
from trainyard.session import CHECKPOINT_DIR_ENV, MESH_ENV, REPORT_EVERY_ENV, SOCKET_ENV
from workers.spec import JobSpec
from workers.storage import Storage


@dataclass(frozen=True)
class RankPlace:
    """Where one rank sits in its group: global rank, rank and count on its node, node index."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    group_rank: int
    node_devices: str | None = None  # CUDA_VISIBLE_DEVICES: the GPUs of this node's ranks, in local-rank order

    @staticmethod
    def of(rank: int, nodes: list[str], gpus: list[list[str]] | None = None) -> RankPlace:
        """The place of `rank` given every rank's node (ranks on one node are numbered in rank order)
        and, on GPUs, every rank's GPU ids as Ray assigned them."""
        mine = nodes[rank]
        order = list(dict.fromkeys(nodes))
        # As under torchrun, each rank sees its node's GPUs and picks cuda:LOCAL_RANK (Ray alone would
        # show each actor only its own, and cuda:LOCAL_RANK would not exist).
        devices = (",".join(g for r, node in enumerate(nodes) if node == mine for g in gpus[r])
                   if gpus and any(gpus) else None)
        return RankPlace(rank, len(nodes), nodes[:rank].count(mine), nodes.count(mine), order.index(mine), devices)


@dataclass(frozen=True)
class Rendezvous:
    """Where a program's ranks meet: MASTER_ADDR:MASTER_PORT, and whether that TCP store is hosted by
    rank 0's actor (as torchrun's agent hosts it: every rank connects as a client) or by rank 0's program."""

    addr: str
    port: int
    agent_store: bool = False


def checkpoint_dir(job: Storage | str | os.PathLike) -> Storage:
    return Storage.of(job) / "checkpoints"


def mesh_layout(spec: JobSpec) -> MeshLayout:
    """The program's DeviceMesh: the trainer's (ParallelDims.mesh_layout, built by trainyard/device_mesh.py in
    the program) less its dimensions of size 1 but dp, so that a program sees the degrees it asked for."""
    return spec.dims.mesh_layout.without_unit_dims()


def rank_environment(spec: JobSpec, job: Storage | str | os.PathLike, place: RankPlace, master: Rendezvous,
                     attempt: int, socket_path: str | None) -> dict[str, str]:
    assert spec.program is not None
    job = Storage.of(job)
    env = {
        "RANK": place.rank, "LOCAL_RANK": place.local_rank, "WORLD_SIZE": place.world_size,
        "LOCAL_WORLD_SIZE": place.local_world_size, "GROUP_RANK": place.group_rank,
        "MASTER_ADDR": master.addr, "MASTER_PORT": master.port,
        "TORCHELASTIC_RESTART_COUNT": attempt, "TORCHELASTIC_MAX_RESTARTS": spec.fault_tolerance.max_restarts,
        "TORCHELASTIC_RUN_ID": job.name,
        # a path on local storage, else the URI: user code writes it with fsspec or DCP
        "TRAINYARD_JOB_ID": job.name, CHECKPOINT_DIR_ENV: checkpoint_dir(job).uri, "TRAINYARD_TRIAL": attempt,
        MESH_ENV: mesh_layout(spec).to_json(),
        "PYTHONUNBUFFERED": "1",  # the rank's log follows the program as it runs
    }
    if master.agent_store:
        env["TORCHELASTIC_USE_AGENT_STORE"] = "True"  # torch's env:// rendezvous: rank 0 connects as a client too
    if socket_path is not None:
        env[SOCKET_ENV] = socket_path
        if spec.fault_injection:  # an injected fault acts at the report of the step it names: send each at once
            env[REPORT_EVERY_ENV] = 0
    if place.node_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = place.node_devices
    return {**spec.program.env, **{k: str(v) for k, v in env.items()}}
