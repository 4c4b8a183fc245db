"""The one DeviceMesh construction of the product: the trainer's (workers/parallel/mesh.py, from the job's
ParallelDims) and a program's `trainyard.mesh()` (from `TRAINYARD_MESH`) are built here, so a program gets
the same dimensions, the same flattened groups and the same ranks in each group as Trainyard's own loop.

This package imports nothing of Trainyard's: the layout arrives as names and sizes (`MeshLayout`), written
by the runner into the program's environment as JSON:

    {"dims": [["pp", 1], ["dp", 2], ["tp", 2]], "flattened": {"dp_cp": ["dp", "cp"]}}

The older form, a map of degrees (`{"dp": 2, "tp": 2}`), is still read: a mesh of those dimensions, nothing
flattened. torch is imported only to build the mesh.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class MeshLayout:
    """A mesh's dimensions, outermost first, and the groups it adds by flattening several of them."""

    dims: tuple[tuple[str, int], ...]
    flattened: tuple[tuple[str, tuple[str, ...]], ...] = field(default=())

    def to_json(self) -> str:
        return json.dumps({"dims": [list(d) for d in self.dims],
                           "flattened": {flat: list(axes) for flat, axes in self.flattened}})

    @classmethod
    def from_json(cls, text: str) -> MeshLayout:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError(f"a mesh layout is a JSON object, got {text!r}")
        if "dims" not in raw:  # the older form: {"dp": 2, "tp": 2}
            return cls(tuple((str(name), int(size)) for name, size in raw.items()))
        return cls(tuple((str(name), int(size)) for name, size in raw["dims"]),
                   tuple((str(flat), tuple(axes)) for flat, axes in raw.get("flattened", {}).items()))

    def without_unit_dims(self, keep: tuple[str, ...] = ("dp",)) -> MeshLayout:
        """The same mesh less its dimensions of size 1 (but those in `keep`), as a program sees it: the
        same groups and ranks in each, and `mesh.get_group()` still works on a 1-D data-parallel job."""
        dims = tuple((name, size) for name, size in self.dims if size > 1 or name in keep)
        kept = {name for name, _ in dims}
        return MeshLayout(dims, tuple((flat, axes) for flat, axes in self.flattened if set(axes) <= kept))

    @property
    def world_size(self) -> int:
        size = 1
        for _, degree in self.dims:
            size *= degree
        return size


def build_device_mesh(layout: MeshLayout, device_type: str) -> Any:
    """Collective: every rank calls it with the same layout, over the default process group. Returns a
    torch DeviceMesh (typed Any: this module loads without torch)."""
    from torch.distributed.device_mesh import init_device_mesh

    names, sizes = zip(*layout.dims)
    mesh = init_device_mesh(device_type, tuple(sizes), mesh_dim_names=tuple(names))
    for flat, axes in layout.flattened:
        mesh[axes]._flatten(flat)  # registered on the root mesh: mesh[flat] is the group spanning `axes`
    return mesh
