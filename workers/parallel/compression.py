"""DDP communication hooks: plain, fp16/bf16-compressed and PowerSGD all-reduces, and the 1-bit SGD and
signSGD all-gathers of packed signs (sign_compression.py), each metered.

(No `from __future__ import annotations`: DDP checks the hooks' real annotations.)

Logical bytes are those the all-reduces are asked to move: the compressed
buffer for fp16/bf16 (half the fp32 bytes), and for PowerSGD the P and Q
factors plus the tensors it leaves uncompressed (vectors, small matrices),
read from the hook's own element counters; before `start_step` PowerSGD runs
the plain all-reduce so that error feedback sees fixed bucket shapes. Each compressing hook also notes
what DDP's fp32 all-reduce of its bucket would have moved: the job's compression ratio.

Bytes crossing nodes: these flat hooks run one ring over every rank (gloo's ring: rank r sends to
r + 1), so a rank's bytes cross nodes when its successor is on another node of the placement's node
map (`crosses`). parallel.collectives 'hierarchical' is its own hook (workers/parallel/hierarchical.py).
"""

import weakref
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

from workers.parallel.hierarchical import hierarchical
from workers.parallel.loop_hooks import NO_HOOKS, LoopHooks
from workers.parallel.metered_state import MeteredState
from workers.parallel.sign_compression import SignResiduals, SignState, sign_hook
from workers.storage_tracker import GRADS, note_lasting
from workers.telemetry import CommMeter, ring_allreduce_bytes


def _launched(state: MeteredState, nbytes: int) -> None:
    state.meter.launched(nbytes, nbytes if state.crosses else 0)


def _done(meter: CommMeter):
    def finish(f: torch.futures.Future) -> torch.Tensor:
        meter.finished()
        return f.value()[0] if isinstance(f.value(), list) else f.value()
    return finish


def plain_hook(state: MeteredState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """The default averaging all-reduce."""
    buffer = bucket.buffer()
    note_lasting([buffer], GRADS, state.owner())  # the reducer's bucket lives across steps: peak memory counts it
    world = dist.get_world_size()
    _launched(state, ring_allreduce_bytes(buffer.numel() * buffer.element_size(), world))
    buffer.div_(world)
    return dist.all_reduce(buffer, async_op=True).get_future().then(_done(state.meter))


def _cast_hook(dtype: torch.dtype):
    def hook(state: MeteredState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        buffer = bucket.buffer()
        note_lasting([buffer], GRADS, state.owner())  # the reducer's bucket lives across steps: peak memory counts it
        world = dist.get_world_size()
        compressed = buffer.to(dtype).div_(world)
        state.meter.compressed(ring_allreduce_bytes(buffer.numel() * 4, world))
        _launched(state, ring_allreduce_bytes(compressed.numel() * compressed.element_size(), world))
        fut = dist.all_reduce(compressed, async_op=True).get_future()

        def decompress(f: torch.futures.Future) -> torch.Tensor:
            state.meter.finished()
            buffer.copy_(f.value()[0])
            return buffer

        return fut.then(decompress)
    return hook


def powersgd_hook(state: MeteredState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    inner: powersgd.PowerSGDState = state.inner
    # PowerSGD launches its second and third all-reduces from completion callbacks. On gloo those run
    # on its own threads, so two buckets in flight could issue collectives in a different order on
    # different ranks (a size-mismatch abort): finish the previous bucket before starting the next.
    if state.previous is not None and dist.get_backend() == "gloo":
        state.previous.wait()
    buffer = bucket.buffer()
    note_lasting([buffer], GRADS, state.owner())  # the reducer's bucket lives across steps: peak memory counts it
    world = dist.get_world_size()
    warm_up = inner.iter < inner.start_powerSGD_iter
    before = inner.total_numel_after_compression
    fut = powersgd.powerSGD_hook(inner, bucket)
    numel = buffer.numel() if warm_up else inner.total_numel_after_compression - before
    _launched(state, ring_allreduce_bytes(numel * buffer.element_size(), world))
    state.meter.compressed(ring_allreduce_bytes(buffer.numel() * 4, world))
    state.previous = fut.then(_done(state.meter))
    return state.previous


def _plain(ctx) -> tuple[MeteredState, Callable]:
    return MeteredState(ctx.comm), plain_hook


def _fp16(ctx):
    return MeteredState(ctx.comm), _cast_hook(torch.float16)


def _bf16(ctx):
    return MeteredState(ctx.comm), _cast_hook(torch.bfloat16)  # NCCL only: refused on CPU by the spec


def _powersgd(ctx):
    c = ctx.spec.parallel.compression
    inner = powersgd.PowerSGDState(
        process_group=None, matrix_approximation_rank=c.rank, start_powerSGD_iter=max(2, c.start_step),
        min_compression_rate=2, use_error_feedback=True, warm_start=True, random_seed=ctx.spec.train.seed,
    )
    return MeteredState(ctx.comm, inner), powersgd_hook


def _sign(ctx):
    c = ctx.spec.parallel.compression
    return SignState(ctx.comm, c.kind, c.uses_error_feedback), sign_hook


# parallel.compression.kind (None = no compression) -> (state, hook) builder
COMM_HOOKS: dict[str | None, Callable] = {None: _plain, "fp16": _fp16, "bf16": _bf16, "powersgd": _powersgd,
                                          "onebit": _sign, "signsgd": _sign}


def register_comm_hook(ddp, ctx) -> LoopHooks:
    """The job's hook on `ddp`; returns what it adds to the loop (onebit/signsgd: residuals checkpointed)."""
    c = ctx.spec.parallel.compression
    kind = c.kind if c is not None else None
    if ctx.spec.parallel.collectives == "hierarchical":
        state, hook = hierarchical(ctx, kind)  # compression (fp16/bf16) on the cross-node stage only
    else:
        state, hook = COMM_HOOKS[kind](ctx)
        state.crosses = ring_crosses_nodes(ctx)
    ctx.comm.counts_nodes = bool(getattr(ctx, "nodes", ()))  # else its cross-node bytes are not known
    state.owner = weakref.ref(ddp)
    ddp.register_comm_hook(state, hook)
    return SignResiduals(state) if isinstance(state, SignState) and state.error_feedback else NO_HOOKS


def ring_crosses_nodes(ctx) -> bool:
    """Whether this rank's successor in the flat ring is on another node (False without a node map)."""
    nodes = getattr(ctx, "nodes", ())
    if not nodes or ctx.world_size < 2 or dist.get_world_size() != len(nodes):
        return False
    return nodes[ctx.rank] != nodes[(ctx.rank + 1) % len(nodes)]


def hooks_off_the_autograd_thread(spec) -> bool:
    """The job's hook issues collectives from completion callbacks (PowerSGD's second and third
    all-reduces), not only from the autograd thread that runs the hook."""
    c = spec.parallel.compression
    return c is not None and c.kind == "powersgd"
