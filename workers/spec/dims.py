"""ParallelDims: a job's parallel degrees, the one place their arithmetic lives (torch-free).

Ranks are laid out row-major over MESH_ORDER = (pp, dp_replicate, dp_shard, cp, tp): tensor-parallel
peers are adjacent ranks (they talk most), pipeline stages farthest apart. The data-parallel degree
is dp_replicate x dp_shard: FSDP shards parameters over dp_shard and replicates across dp_replicate
(HSDP); DDP and ZeRO-1/2 replicate parameters over all of dp. Context parallelism (cp) splits each
micro-batch's sequence; expert parallelism (ep) borrows its ranks from the data-parallel ones (dp x cp
must be a multiple of ep), so it adds no ranks of its own.

`mesh_dims` names the one DeviceMesh's dimensions (`mesh_layout`, which trainyard/device_mesh.py builds
for the trainer and for a program's `trainyard.mesh()` alike): pp, dp and tp always (a strategy may ask
any of them for its group), dp_replicate and dp_shard only when both exceed 1 (then dp is their
flattening), dp split into
dp_mod_ep x ep under expert parallelism (dp their flattening too), cp only when it exceeds 1. Every
other question (a rank's coordinates, the ranks of a group, elastic candidates) is answered here without
torch, so the API, the supervisor and the planner ask the same arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace

from trainyard.device_mesh import MeshLayout

MESH_ORDER = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
# Groups made of several mesh axes (ranks that differ only along those axes).
FLATTENED = {"dp": ("dp_replicate", "dp_shard"), "dp_cp": ("dp_replicate", "dp_shard", "cp"),
             "dp_shard_cp": ("dp_shard", "cp")}


@dataclass(frozen=True)
class ParallelDims:
    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    cp: int = 1
    tp: int = 1
    ep: int = 1  # within dp x cp: no ranks of its own

    @classmethod
    def of(cls, parallel, workers: int) -> "ParallelDims":
        """The degrees a `parallel` section gives on `workers` ranks: dp defaults to what the model-parallel
        degrees leave; FSDP (zero 3) shards over parallel.dp_shard, default all of dp. Meaningful for a
        spec whose degrees passed `violations` (an unchecked one may not factor)."""
        cp = parallel.cp
        dp = parallel.dp if parallel.dp is not None else max(1, workers // (parallel.tp * parallel.pp * cp))
        shard = parallel.dp_shard if parallel.dp_shard is not None else (dp if parallel.zero == 3 else 1)
        shard = shard if shard >= 1 and dp % shard == 0 else dp
        return cls(pp=parallel.pp, dp_replicate=dp // shard, dp_shard=shard, cp=cp, tp=parallel.tp, ep=parallel.ep)

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.cp * self.tp

    def size(self, dim: str) -> int:
        """The degree of a mesh axis or of a flattened group (dp, dp_cp, dp_shard_cp)."""
        return math.prod(getattr(self, axis) for axis in FLATTENED.get(dim, (dim,)))

    # --- the DeviceMesh -------------------------------------------------------------------------
    @property
    def mesh_dims(self) -> tuple[tuple[str, int], ...]:
        """(name, size) of the DeviceMesh's dimensions, outermost first."""
        split = self.dp_replicate > 1 and self.dp_shard > 1
        dp = (("dp_replicate", self.dp_replicate), ("dp_shard", self.dp_shard)) if split else (("dp", self.dp),)
        if self.ep > 1 and not split:  # experts sharded over consecutive dp ranks, replicated across those groups
            dp = (("dp_mod_ep", self.dp // self.ep), ("ep", self.ep))
        cp = (("cp", self.cp),) if self.cp > 1 else ()
        return (("pp", self.pp), *dp, *cp, ("tp", self.tp))

    def mesh_axes(self, dim: str) -> tuple[str, ...]:
        """The mesh dimensions that make up `dim` (an axis or a flattened group) in this mesh: an axis of
        size 1 that the mesh leaves out contributes none; dp_replicate or dp_shard alone is the mesh's dp."""
        names = {name for name, _ in self.mesh_dims}
        if dim in names:
            return (dim,)
        if "ep" in names and dim in ("dp", "dp_cp", "dp_shard_cp"):  # dp is split by ep: the two are dp
            return ("dp_mod_ep", "ep") + (("cp",) if "cp" in names and dim != "dp" else ())
        axes = FLATTENED.get(dim, (dim,))
        out: list[str] = []
        for axis in axes:
            if axis in names:
                out.append(axis)
            elif axis.startswith("dp_") and "dp" not in out and "dp" in names:
                # the mesh's dp stands for both halves: a group of all of dp (even of size 1), or of a half
                # that is the whole of dp
                both = {"dp_replicate", "dp_shard"} <= set(axes)
                if both or getattr(self, axis) > 1:
                    out.append("dp")
        return tuple(out)

    @property
    def mesh_flattened(self) -> dict[str, tuple[str, ...]]:
        """Groups the mesh adds by flattening several of its dimensions (one per distinct set of them)."""
        names = {name for name, _ in self.mesh_dims}
        out: dict[str, tuple[str, ...]] = {}
        for flat in FLATTENED:
            axes = self.mesh_axes(flat)
            if flat not in names and len(axes) > 1 and axes not in out.values():
                out[flat] = axes
        return out

    @property
    def mesh_layout(self) -> MeshLayout:
        """The mesh as names and sizes: what trainyard/device_mesh.py builds, for the trainer and a program."""
        return MeshLayout(self.mesh_dims, tuple(self.mesh_flattened.items()))

    def mesh_key(self, dim: str) -> str | None:
        """The name to index the mesh by for `dim`'s group; None where the group is every rank alone."""
        axes = self.mesh_axes(dim)
        if len(axes) <= 1:
            return axes[0] if axes else None
        return next(flat for flat, made_of in self.mesh_flattened.items() if made_of == axes)

    # --- where ranks sit ------------------------------------------------------------------------
    def coordinates(self, rank: int) -> dict[str, int]:
        """The rank's index along each axis (MESH_ORDER) and within each flattened group."""
        coords, rest = {}, rank
        for axis in reversed(MESH_ORDER):
            rest, coords[axis] = divmod(rest, getattr(self, axis))
        for flat, axes in FLATTENED.items():
            index = 0
            for axis in axes:
                index = index * getattr(self, axis) + coords[axis]
            coords[flat] = index
        return {axis: coords[axis] for axis in (*MESH_ORDER, *FLATTENED)}

    def rank_of(self, coords: dict[str, int]) -> int:
        rank = 0
        for axis in MESH_ORDER:
            rank = rank * getattr(self, axis) + coords.get(axis, 0)
        return rank

    def groups(self, dim: str) -> list[list[int]]:
        """Every group of ranks along `dim` (an axis or a flattened group), each in the dim's order."""
        axes = FLATTENED.get(dim, (dim,))
        others = [a for a in MESH_ORDER if a not in axes]
        out = []
        for fixed in _product([getattr(self, a) for a in others]):
            base = dict(zip(others, fixed))
            out.append([self.rank_of({**base, **dict(zip(axes, inner))})
                        for inner in _product([getattr(self, a) for a in axes])])
        return out

    # --- checks and elastic sizes -----------------------------------------------------------------
    def violations(self, workers: int) -> Iterator[tuple[str, str]]:
        """(field, message) for each degree rule broken; every message prints every factor."""
        if self.world_size != workers:
            yield ("parallel", f"parallel: dp x cp x tp x pp must equal resources.workers "
                               f"(dp={self.dp} x cp={self.cp} x tp={self.tp} x pp={self.pp} = {self.world_size}, "
                               f"workers={workers})" if self.cp > 1 else
                               f"parallel: dp x tp x pp must equal resources.workers "
                               f"(dp={self.dp} x tp={self.tp} x pp={self.pp} = {self.world_size}, workers={workers})")
        if (self.dp * self.cp) % self.ep:
            yield ("parallel.ep", f"parallel.ep must divide parallel.dp x parallel.cp, the ranks it borrows "
                                  f"(ep={self.ep}, dp={self.dp}, cp={self.cp})")

    def resized(self, workers: int) -> Iterator["ParallelDims"]:
        """Layouts for `workers` ranks, best first: the model-parallel degrees (tp, pp, cp) kept where they
        divide, else dropped, tp and pp one at a time; data parallelism takes the rest, HSDP keeping its
        shard size where it divides the new dp, else sharding over all of it; ep the largest of its
        divisors that divides the new dp x cp (the experts are spread over fewer ranks, each holding more)."""
        seen = set()
        for tp, pp, cp in ((self.tp, self.pp, self.cp), (self.tp, 1, self.cp), (1, self.pp, self.cp),
                           (1, 1, self.cp), (1, 1, 1)):
            if (tp, pp, cp) in seen or workers % (tp * pp * cp):
                continue
            seen.add((tp, pp, cp))
            dp = workers // (tp * pp * cp)
            hsdp = self.dp_replicate > 1 and self.dp_shard > 1
            shard = self.dp_shard if hsdp and dp % self.dp_shard == 0 else (dp if self.dp_shard > 1 else 1)
            ep = max(e for e in range(1, self.ep + 1) if self.ep % e == 0 and (dp * cp) % e == 0)
            yield replace(self, pp=pp, tp=tp, cp=cp, ep=ep, dp_replicate=dp // shard, dp_shard=shard)


def _product(sizes: list[int]) -> Iterator[tuple[int, ...]]:
    """Every index tuple of a grid, row-major."""
    if not sizes:
        yield ()
        return
    for head in range(sizes[0]):
        for tail in _product(sizes[1:]):
            yield (head, *tail)
