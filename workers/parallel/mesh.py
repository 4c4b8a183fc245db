"""The one DeviceMesh of a job, from its ParallelDims (workers/spec/dims.py): trainyard/device_mesh.py
builds it (the only mesh construction in the product, a program's `trainyard.mesh()` included); a
strategy asks `group_mesh` for the mesh of any axis or flattened group."""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh

from trainyard.device_mesh import build_device_mesh
from workers.spec.dims import ParallelDims


def build_mesh(dims: ParallelDims, device_type: str) -> DeviceMesh:
    """Collective: every rank, same dims. Dimensions of size 1 that every strategy may ask for (pp, dp, tp)
    are kept; split ones (HSDP's dp_replicate x dp_shard, cp) are flattened into the groups that span them."""
    return build_device_mesh(dims.mesh_layout, device_type)


def group_mesh(mesh: DeviceMesh, dims: ParallelDims, dim: str) -> DeviceMesh | None:
    """The mesh of `dim`'s group (an axis, or dp / dp_cp / dp_shard_cp); None where each rank is alone in it."""
    key = dims.mesh_key(dim)
    return None if key is None else mesh[key]
