"""The data-parallel step's options, torch-free: the last thing `parallelize` applies (issue 47's fixed
order: tp/sp -> cp -> ep -> activation checkpointing -> the data-parallel step). DDP, ZeRO-1/2, FSDP2/HSDP,
compression, local SGD and SDP are options of that one step, read from a checked spec once; the step
(workers/parallel/data_parallel/) is built from them, and the supervisor's straggler policies ask what
it can take (`capabilities`) without loading torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from workers.parallel.layouts.layout import UNEVEN_SHARES, StepCapabilities
from workers.spec import JobSpec
from workers.spec.dims import ParallelDims
from workers.spec.parallel import CompressionSpec, SDPSpec

# replicate: whole parameters and gradients on every rank of the group, gradients reduced once per step (DDP,
# or the all-reduce of local DTensor pieces under tensor parallelism); zero1/zero2: replicate with the AdamW
# state (and gradients) sharded; fsdp: parameters sharded too (FSDP2, HSDP over two groups); local_sgd:
# replicate without gradient reduction, parameters averaged every period; sdp: each rank its subnetwork.
DataParallelKind = Literal["replicate", "zero1", "zero2", "fsdp", "local_sgd", "sdp"]

# Where uneven shares are ruled out, the reason names the field that rules them out (a 422's message).
_WHY_EVEN: dict[str, str] = {
    "zero2": "parallel.zero 2 reduce-scatters gradients in every micro-batch, so uneven micro-batch counts per "
             "rank would desynchronise its collectives; zero 0 or 1 takes them (zero=2)",
    "fsdp": "parallel.zero 3 (FSDP) all-gathers parameters for every micro-batch, so uneven micro-batch counts per "
            "rank would desynchronise its collectives; zero 0 or 1 takes them (zero=3)",
    "local_sgd": "parallel.local_sgd averages the parameters of whole replicas, not gradients weighted by data shares",
    "sdp": "parallel.sdp averages gradients per holder set, not weighted by data shares",
}


def _kind(spec: JobSpec) -> DataParallelKind:
    p = spec.parallel
    if p.sdp is not None:
        return "sdp"
    if p.zero == 3:
        return "fsdp"
    if p.zero in (1, 2):
        return "zero1" if p.zero == 1 else "zero2"
    if p.local_sgd is not None:
        return "local_sgd"
    return "replicate"


@dataclass(frozen=True)
class DataParallelOptions:
    kind: DataParallelKind
    # The groups it reduces (or shards) over, as ParallelDims names: ("dp_cp",), or HSDP's replicate group
    # and shard group ("dp_replicate", "dp_shard_cp"). Context-parallel ranks hold the same parameters.
    group: tuple[str, ...]
    dims: ParallelDims  # the other axes: whose ranks must see the same samples, how many pipeline stages
    compression: CompressionSpec | None = None  # replicate: DDP's communication hook
    local_sgd_period: int | None = None
    reshard_after_forward: bool = True  # fsdp
    fsdp_accumulate: Literal["sharded", "unsharded"] = "sharded"
    offload_optimizer: bool = False  # zero1/zero2
    mixed_precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    sdp: SDPSpec | None = None
    program: bool = False  # a user's own loop: its data and its step are its own

    @classmethod
    def of(cls, spec: JobSpec) -> "DataParallelOptions":
        """The options of a checked spec."""
        p, kind = spec.parallel, _kind(spec)
        hsdp = kind == "fsdp" and p.dp_shard is not None
        return cls(kind=kind, group=("dp_replicate", "dp_shard_cp") if hsdp else ("dp_cp",), dims=spec.dims,
                   compression=p.compression, local_sgd_period=p.local_sgd.period if p.local_sgd else None,
                   reshard_after_forward=p.reshard_after_forward, fsdp_accumulate=p.fsdp_accumulate,
                   offload_optimizer=p.offload_optimizer, mixed_precision=p.mixed_precision, sdp=p.sdp,
                   program=spec.program is not None)

    @property
    def capabilities(self) -> StepCapabilities:
        """What the step can take. Uneven shares (data-parallel ranks running different micro-batch counts in one
        step) only where it reduces gradients once per step, weighting each rank by its samples, and every other
        axis is 1: the tp, cp and ep ranks of one dp index must see the same samples."""
        d = self.dims
        if self.program:
            return StepCapabilities(why_not_uneven="a program's data is its own: Trainyard cannot re-split it")
        if not d.tp == d.cp == d.ep == 1:
            return StepCapabilities(why_not_uneven=f"the tp, cp and ep ranks of one data-parallel index must see the "
                                                   f"same samples (tp={d.tp}, cp={d.cp}, ep={d.ep})")
        if d.pp > 1:  # each stage's replicate step, behind a schedule that flushes every micro-batch
            return StepCapabilities(why_not_uneven="parallel.pp > 1 flushes the same micro-batch count through every "
                                                   "stage; parallel.pipeline.rebalance_threshold balances the stages "
                                                   f"(pp={d.pp})")
        if self.kind in _WHY_EVEN:
            return StepCapabilities(why_not_uneven=_WHY_EVEN[self.kind])
        return UNEVEN_SHARES  # replicate and zero1: one gradient reduction per step
