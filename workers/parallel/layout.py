"""The parallel layout: degrees, the DeviceMesh, and where this rank sits in it.

Mesh dimensions are ordered ("pp", "dp", "tp"): tensor-parallel peers are
adjacent ranks (they talk most), pipeline stages are farthest apart. Dimensions
of size 1 are kept so that every strategy can ask for any of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from workers.spec import JobSpec

MESH_DIMS = ("pp", "dp", "tp")


@dataclass(frozen=True)
class Layout:
    pp: int
    dp: int
    tp: int

    @classmethod
    def of(cls, spec: JobSpec) -> "Layout":
        return cls(pp=spec.parallel.pp, dp=spec.dp, tp=spec.parallel.tp)

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.tp

    def coordinates(self, rank: int) -> dict[str, int]:
        """This rank's index along each mesh dimension (row-major over MESH_DIMS)."""
        pp, rest = divmod(rank, self.dp * self.tp)
        dp, tp = divmod(rest, self.tp)
        return {"pp": pp, "dp": dp, "tp": tp}

    def build_mesh(self, device: torch.device) -> DeviceMesh:
        return init_device_mesh(device.type, (self.pp, self.dp, self.tp), mesh_dim_names=MESH_DIMS)
