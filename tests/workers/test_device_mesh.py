"""The one mesh construction (trainyard/device_mesh.py): a program's `trainyard.mesh()`, built from the
environment the runner writes, is the trainer's mesh (workers/parallel/mesh.py): the same dimension names
and sizes, the same flattened groups, the same ranks in every group. Four real gloo ranks (no Ray)."""

from __future__ import annotations

import os

import pytest
import torch.distributed as dist

from tests.workers.gloo_ranks import spawn_ranks
from trainyard.device_mesh import MeshLayout
from workers.spec.dims import ParallelDims

LAYOUTS = {  # the mesh shapes a 4-rank job takes: plain, HSDP (split dp), context- and expert-parallel
    "dp2_tp2": ParallelDims(dp_replicate=2, tp=2),
    "hsdp2x2": ParallelDims(dp_replicate=2, dp_shard=2),
    "dp2_cp2": ParallelDims(dp_replicate=2, cp=2),
    "dp4_ep2": ParallelDims(dp_replicate=4, ep=2),
}


def _groups(mesh, names) -> dict[str, list[int]]:
    """This rank's group along each named dimension or flattened group, as global ranks."""
    return {name: dist.get_process_group_ranks(mesh[name].get_group()) for name in names}


def _meshes(rank, world, port, queue):
    import trainyard
    from trainyard import session
    from workers.parallel.mesh import build_mesh

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    seen = {}
    for label, dims in LAYOUTS.items():
        trainer = build_mesh(dims, "cpu")
        layout = dims.mesh_layout.without_unit_dims()  # as workers/program/environment.py writes it
        os.environ[session.MESH_ENV] = layout.to_json()
        session.bind(None)  # a fresh program: its mesh is built on first use
        program = trainyard.mesh()
        names = [*trainer.mesh_dim_names, *dims.mesh_flattened]
        seen[label] = {"trainer": (list(trainer.mesh_dim_names), list(trainer.shape), _groups(trainer, names)),
                       "program": (list(program.mesh_dim_names), list(program.shape),
                                   _groups(program, [*program.mesh_dim_names, *dict(layout.flattened)]))}
    queue.put((rank, seen))
    dist.destroy_process_group()


def _expected_group(dims: ParallelDims, dim: str, rank: int) -> list[int]:
    """The rank's group along `dim` by ParallelDims' own arithmetic. Expert parallelism splits dp into
    dp_mod_ep x ep: an ep group is ep consecutive dp ranks, a dp_mod_ep group every ep-th one."""
    if dim not in ("ep", "dp_mod_ep"):
        return next(g for g in dims.groups(dim) if rank in g)
    dp_group = next(g for g in dims.groups("dp") if rank in g)
    at = dp_group.index(rank)
    if dim == "ep":
        return dp_group[at - at % dims.ep:][:dims.ep]
    return dp_group[at % dims.ep::dims.ep]


def test_a_programs_mesh_is_the_trainers_mesh():
    for rank, seen in spawn_ranks(_meshes, 4):
        for label, dims in LAYOUTS.items():
            trainer, program = seen[label]["trainer"], seen[label]["program"]
            names, shape, groups = trainer
            # the program's mesh is the trainer's less its unit dimensions (dp kept): the same groups
            assert list(zip(program[0], program[1])) == [(n, s) for n, s in zip(names, shape) if s > 1 or n == "dp"]
            assert program[2] == {dim: groups[dim] for dim in program[2]}, (rank, label)
            assert "dp" in program[2], (rank, label)
            assert tuple(zip(names, shape)) == dims.mesh_dims, (rank, label)
            for dim, ranks in groups.items():
                assert ranks == _expected_group(dims, dim, rank), (rank, label, dim)
            assert set(dims.mesh_flattened) <= set(groups), (rank, label)


def test_the_mesh_layout_travels_as_json_and_the_older_degrees_still_read():
    hsdp = ParallelDims(dp_replicate=2, dp_shard=2, cp=2)
    layout = hsdp.mesh_layout
    assert layout.dims == (("pp", 1), ("dp_replicate", 2), ("dp_shard", 2), ("cp", 2), ("tp", 1))
    assert dict(layout.flattened)["dp"] == ("dp_replicate", "dp_shard") and "dp_cp" in dict(layout.flattened)
    assert MeshLayout.from_json(layout.to_json()) == layout
    assert MeshLayout.from_json('{"dp": 2, "tp": 2}') == MeshLayout((("dp", 2), ("tp", 2)))  # the older form
    assert layout.world_size == 8
    with pytest.raises(ValueError, match="JSON object"):
        MeshLayout.from_json("[2, 2]")
