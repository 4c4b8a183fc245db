"""The peak memory of a pipeline rank: its stages' state and the micro-batches it holds in flight.

A rank holds layers / pp blocks (in `virtual_stages` chunks); the first rank also the embeddings and the last
the final norm and head (half of the parameters outside the blocks each). Gradients accumulate over the
step's micro-batches. Activations are the rank's micro-batches in flight when its backward starts, each
one chunk's blocks plus the stream tensor the stage keeps for its backward:
  gpipe: every micro-batch of the flush; 1f1b: pp - rank (the first stage holds most);
  looped_bfs: every micro-batch of every chunk; the other multi-stage schedules: their warm-up,
  (v - 1) x pp + 2 x (pp - 1 - rank) forwards, plus the one in steady state; chimera: counted from its
  plan, on two stages per rank (stage r of one direction, pp-1-r of the other, the outer parts on both ends);
  pipedream and pipedream_2bw: as 1f1b, plus two copies of the stage's weights (this step's and the last's).
The last rank's micro-batches also keep the logits and their log-softmax, and its first backward adds the
loss's gradients; the other ranks' peak is a block's backward.
"""

from __future__ import annotations

import math

from workers.parallel.activations import MicroBatchActivations
from workers.parallel.layouts.accounting import accumulated_grad_bytes, params_per_rank
from workers.parallel.pipeline.chimera_schedule import build
from workers.parallel.pipeline.stage_plan import stage_to_rank
from workers.spec import (
    ASYNC_SCHEDULES,
    SINGLE_STAGE_SCHEDULES,
    V_SCHEDULES,
    JobSpec,
    PipelineSpec,
    pipeline_microbatches,
)


def in_flight(schedule: str, rank: int, pp: int, virtual: int, microbatches: int) -> int:
    """Chunks (one micro-batch through one of the rank's stages) whose activations a rank holds at its peak."""
    if schedule == "chimera":  # its plan, counted: both directions' forwards whose backward has not run
        return build(pp, microbatches).in_flight_peaks()[rank]
    if schedule == "gpipe" or schedule == "looped_bfs":
        return microbatches * virtual
    if schedule in SINGLE_STAGE_SCHEDULES:  # 1f1b
        return min(pp - rank, microbatches)
    return min(microbatches * virtual, (virtual - 1) * pp + 2 * (pp - 1 - rank) + 1)


def stage_params(spec: JobSpec, facts) -> list[float]:
    """Parameters each pipeline rank holds: its share of the blocks, and half of those outside them on the
    first and on the last rank (chimera: two stages' blocks, and all of the outer ones on both ends)."""
    p = spec.parallel
    per_rank = params_per_rank(spec, facts)
    outer = min(facts.outer_params, per_rank)
    block_params = (per_rank - outer) / max(facts.layers, 1)
    pipe = p.pipeline or PipelineSpec()
    copies = 2 if pipe.schedule == "chimera" else 1
    return [copies * (facts.layers / p.pp * block_params + outer / 2 * ((r == 0) + (r == p.pp - 1)))
            for r in range(p.pp)]


def p2p_bytes(spec: JobSpec, facts, rank: int) -> float:
    """Bytes a pipeline rank sends per step: one fp32 stream tensor per micro-batch for each of its stages'
    edges to another rank (activations forward, their gradients backward)."""
    p = spec.parallel
    pipe = p.pipeline or PipelineSpec()
    n, v_shape = p.pp * pipe.stages_per_rank, pipe.schedule in V_SCHEDULES
    mine = [s for s in range(n) if stage_to_rank(s, p.pp, v_shape) == rank]
    edges = sum((s < n - 1 and stage_to_rank(s + 1, p.pp, v_shape) != rank)
                + (s > 0 and stage_to_rank(s - 1, p.pp, v_shape) != rank) for s in mine)
    return edges * spec.grad_accum_steps * MicroBatchActivations.of(spec, facts).stream


def rank_peaks(spec: JobSpec, facts) -> list[tuple[float, float]]:
    """(state, activations) at the peak of each pipeline rank."""
    p = spec.parallel
    pipe = p.pipeline or PipelineSpec()
    virtual, micro = pipe.stages_per_rank, pipeline_microbatches(spec)
    a = MicroBatchActivations.of(spec, facts)
    blocks = facts.layers / p.pp
    out = []
    for r, params in enumerate(stage_params(spec, facts)):
        stashed = 8 if pipe.schedule in ASYNC_SCHEDULES else 0  # pipedream*: two fp32 copies of the stage
        state = (4 + 8 + accumulated_grad_bytes(spec) + stashed) * params
        if p.zero == 3:  # pp x FSDP2: parameters and AdamW state sharded over dp, gradients whole through a flush
            state = (4 + 8) / spec.dp * params + 4 * params
        chunks = in_flight(pipe.schedule, r, p.pp, virtual, micro)
        act = chunks * (blocks / virtual * a.kept + a.stream)
        heads = (r == p.pp - 1) or (pipe.schedule == "chimera" and r == 0)  # chimera's up pipeline ends on 0
        if heads:
            act += math.ceil(chunks / virtual) * (a.final + 2 * a.logits) + 2 * a.logits
        else:
            act += a.block_backward
        act += a.ring  # pp x cp: the key/value blocks around the ring while a block runs (0 without cp)
        out.append((state, act))
    return out


def peak_rank(spec: JobSpec, facts) -> int:
    """The pipeline rank with the highest peak (the planner predicts for it)."""
    peaks = rank_peaks(spec, facts)
    return max(range(len(peaks)), key=lambda r: sum(peaks[r]))


def pipeline_peak(spec: JobSpec, facts) -> tuple[float, float]:
    """(state, activations) of the rank with the highest peak."""
    return rank_peaks(spec, facts)[peak_rank(spec, facts)]
