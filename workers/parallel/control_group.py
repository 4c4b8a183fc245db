"""The CPU side of every process group: where small control collectives go.

The rule (docs/parallel.md, "Which group a collective uses"): collectives that carry training
data (gradients, parameters, activations, the gradient norm that scales them, model state) use
tensors on the rank's device and the data groups (the default group, the DeviceMesh's groups,
a strategy's own sub-groups): NCCL on GPU, gloo on CPU. Collectives whose values end on the host
(agreement flags, replica digests, pipeline makespans and reported losses, pickled objects,
barriers that only align clocks) go through these gloo groups, created once per process group
(and once per mirrored mesh dimension), with CPU tensors: on GPU they never touch NCCL, and they
never force a device-to-host copy inside the step.

A separate gloo group rather than one `cpu:gloo,cuda:nccl` group: which backend a collective uses
is then visible in the code (the group argument) instead of following wherever a tensor happens
to live, and a test can check every collective's group (tests/workers/test_collective_devices.py).
Every method checks that its tensors are on the CPU.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from workers.runtime.gloo_groups import lazily_connected, lazy_gloo_group
from workers.spec.dims import ParallelDims


class ControlGroups:
    """The world's gloo group, and gloo mirrors of mesh dimensions a strategy asks for."""

    def __init__(self) -> None:
        self.world = lazy_gloo_group()  # collective: every rank, same order; pairs connect on use
        self._dims: dict[str, dist.ProcessGroup] = {}

    def mirror(self, dims: ParallelDims, dim: str) -> dist.ProcessGroup:
        """This rank's gloo group over the same ranks as the mesh's `dim` group (an axis or a flattened
        group). A collective over the world: every rank calls it for the same dimensions in the same order
        (strategies do, in `wrap`)."""
        if dim not in self._dims and dims.size(dim) == dist.get_world_size():
            self._dims[dim] = self.world  # the dimension spans every rank (pure dp): no second all-rank group
        if dim not in self._dims:
            with lazily_connected():
                mine, _ = dist.new_subgroups_by_enumeration(dims.groups(dim), backend="gloo")
            self._dims[dim] = mine
        return self._dims[dim]

    def groups(self) -> list[dist.ProcessGroup]:
        """Every control group of this rank (the collective-device test tells them from data groups)."""
        return list({id(g): g for g in (self.world, *self._dims.values())}.values())

    def _group(self, dim: str | None) -> dist.ProcessGroup:
        return self.world if dim is None else self._dims[dim]

    def all_reduce(self, tensor: torch.Tensor, op=dist.ReduceOp.SUM, dim: str | None = None) -> torch.Tensor:
        _on_cpu(tensor)
        dist.all_reduce(tensor, op=op, group=self._group(dim))
        return tensor

    def all_gather(self, out: list[torch.Tensor], tensor: torch.Tensor, dim: str | None = None) -> None:
        _on_cpu(tensor, *out)
        dist.all_gather(out, tensor, group=self._group(dim))

    def all_gather_object(self, out: list, obj: object, dim: str | None = None) -> None:
        dist.all_gather_object(out, obj, group=self._group(dim))  # pickled to CPU bytes on a gloo group

    def barrier(self, dim: str | None = None) -> None:
        dist.barrier(group=self._group(dim))


def _on_cpu(*tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.device.type != "cpu":
            raise ValueError(f"a control collective takes CPU tensors (got one on {t.device}): "
                             f"device values belong on a data group")
