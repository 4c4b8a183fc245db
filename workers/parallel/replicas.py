"""Replica groups: the tensors a rank holds that must be bit-identical on other ranks.

Every strategy declares them (`Strategy.replica_groups`), so that the replica check
(workers/training/integrity.py) compares only what is meant to be identical, within the
ranks that hold it: whole parameters over dp (DDP, ZeRO-1/2, local SGD right after an
average), each tensor-parallel shard or pipeline stage over dp, each HSDP shard over
dp_replicate, each SDP piece over its holders. Replicas here are data-parallel ones:
tensors replicated over tp (embeddings, norms) are equal by construction but not compared.
Layouts without replicas (FSDP, TP or a pipeline with dp 1) are still checked: each rank verifies
its own state at rest (workers/training/shard_integrity.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh


@dataclass(frozen=True)
class ReplicaGroup:
    ranks: tuple[int, ...]  # the global ranks that hold the same tensors, this one included
    tensors: tuple[torch.Tensor, ...]  # what this rank holds of them (local shards, never gathered)


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor (the local shard of a DTensor)."""
    return t._local_tensor if hasattr(t, "_local_tensor") else t


def mesh_ranks(mesh: DeviceMesh) -> tuple[int, ...]:
    """The global ranks of this rank's 1-D sub-mesh (no process group is created)."""
    return tuple(int(r) for r in mesh.mesh.flatten().tolist())


def replicated_over(mesh: DeviceMesh, params: Iterable[nn.Parameter]) -> list[ReplicaGroup]:
    """This rank's parameters (or their local shards), replicated over `mesh`; none when it has one rank."""
    ranks = mesh_ranks(mesh)
    if len(ranks) < 2:
        return []
    return [ReplicaGroup(ranks, tuple(local(p.detach()) for p in params))]
