"""The one DeviceMesh of a job: built from its ParallelDims (workers/spec/dims.py), the only mesh
construction in the product; a strategy asks `group_mesh` for the mesh of any axis or flattened group."""

from __future__ import annotations

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from workers.spec.dims import ParallelDims


def build_mesh(dims: ParallelDims, device_type: str) -> DeviceMesh:
    """Collective: every rank, same dims. Dimensions of size 1 that every strategy may ask for (pp, dp, tp)
    are kept; split ones (HSDP's dp_replicate x dp_shard, cp) are flattened into the groups that span them."""
    names, sizes = zip(*dims.mesh_dims)
    mesh = init_device_mesh(device_type, sizes, mesh_dim_names=names)
    for flat, axes in dims.mesh_flattened.items():
        mesh[axes]._flatten(flat)
    return mesh


def group_mesh(mesh: DeviceMesh, dims: ParallelDims, dim: str) -> DeviceMesh | None:
    """The mesh of `dim`'s group (an axis, or dp / dp_cp / dp_shard_cp); None where each rank is alone in it."""
    key = dims.mesh_key(dim)
    return None if key is None else mesh[key]
