"""The peak memory of a pipeline rank: its stages' state and the micro-batches it holds in flight.

A rank holds layers / pp blocks (in `virtual_stages` chunks); the first rank also the embeddings and the last
the final norm and head (half of the parameters outside the blocks each). Gradients accumulate over the
step's micro-batches. Activations are the rank's micro-batches in flight when its backward starts, each
one chunk's blocks plus the stream tensor the stage keeps for its backward:
  gpipe: every micro-batch of the flush; 1f1b: pp - rank (the first stage holds most);
  looped_bfs: every micro-batch of every chunk; the other multi-stage schedules: their warm-up,
  (v - 1) x pp + 2 x (pp - 1 - rank) forwards, plus the one in steady state.
The last rank's micro-batches also keep the logits and their log-softmax, and its first backward adds the
loss's gradients; the other ranks' peak is a block's backward.
"""

from __future__ import annotations

import math

from workers.parallel.activations import MicroBatchActivations
from workers.parallel.layouts.accounting import accumulated_grad_bytes, params_per_rank
from workers.spec import SINGLE_STAGE_SCHEDULES, JobSpec, PipelineSpec, pipeline_microbatches


def in_flight(schedule: str, rank: int, pp: int, virtual: int, microbatches: int) -> int:
    """Chunks (one micro-batch through one of the rank's stages) whose activations a rank holds at its peak."""
    if schedule == "gpipe" or schedule == "looped_bfs":
        return microbatches * virtual
    if schedule in SINGLE_STAGE_SCHEDULES:  # 1f1b
        return min(pp - rank, microbatches)
    return min(microbatches * virtual, (virtual - 1) * pp + 2 * (pp - 1 - rank) + 1)


def rank_peaks(spec: JobSpec, facts) -> list[tuple[float, float]]:
    """(state, activations) at the peak of each pipeline rank."""
    p = spec.parallel
    pipe = p.pipeline or PipelineSpec()
    virtual, micro = pipe.stages_per_rank, pipeline_microbatches(spec)
    per_rank = params_per_rank(spec, facts)
    outer = min(facts.outer_params, per_rank)
    block_params = (per_rank - outer) / max(facts.layers, 1)
    a = MicroBatchActivations.of(spec, facts)
    blocks = facts.layers / p.pp
    out = []
    for r in range(p.pp):
        params = blocks * block_params + outer / 2 * ((r == 0) + (r == p.pp - 1))
        state = (4 + 8 + accumulated_grad_bytes(spec)) * params
        chunks = in_flight(pipe.schedule, r, p.pp, virtual, micro)
        act = chunks * (blocks / virtual * a.kept + a.stream)
        if r == p.pp - 1:
            act += math.ceil(chunks / virtual) * (a.final + 2 * a.logits) + 2 * a.logits
        else:
            act += a.block_backward
        act += a.ring  # pp x cp: the key/value blocks around the ring while a block runs (0 without cp)
        out.append((state, act))
    return out


def pipeline_peak(spec: JobSpec, facts) -> tuple[float, float]:
    """(state, activations) of the rank with the highest peak."""
    return max(rank_peaks(spec, facts), key=sum)
