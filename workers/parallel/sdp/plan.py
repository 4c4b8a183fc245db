"""Planner predictions for an SDP layout, from the mask assignment itself (it is cheap and deterministic).

Worker 0's subnetwork is cut on the meta device (shapes only) and its pieces give:
  model state  4 bytes x parameters kept + 12 bytes x trainable ones (grads + AdamW moments),
               divided by dp_shard under FSDP;
  comm/step    every step: one ring all-reduce per holder set over its bucket, 2(|H|-1)/|H| x bytes;
               backward masking adds one broadcast of every holder set's pieces that not all workers hold;
               {period: H}: both divided by H; FSDP adds its gathers and reduce-scatter within dp_shard
               (workers/parallel/data_parallel/shard_root.py: the root unit is gathered once per micro-batch).
"""

from __future__ import annotations

import torch

from workers.models import build_model
from workers.models.description import blocks_at
from workers.parallel.data_parallel.shard_root import gathered_per_micro_batch
from workers.parallel.sdp.assignment import assignment_of, blocks_of
from workers.parallel.sdp.subnetwork import build_subnetwork
from workers.spec import JobSpec, SDPPeriodSpec


def _ring(k: int) -> float:
    return 2 * (k - 1) / k if k > 1 else 0.0


def sdp_bytes(spec: JobSpec) -> tuple[int, int]:
    """(model-state bytes, logical comm bytes per step) of worker 0."""
    p, sdp = spec.parallel, spec.parallel.sdp
    assert sdp is not None  # the SDP code runs only for a spec with parallel.sdp
    shards = p.dp_shard if p.zero == 3 else 1
    assert shards is not None, "the spec rules require parallel.dp_shard with parallel.sdp and zero 3"
    with torch.device("meta"):
        model = build_model(spec)
    path = blocks_of(model, spec)
    a = assignment_of(spec, len(blocks_at(model, path)))  # off the meta device: the masks are real
    with torch.device("meta"):
        sub, pieces = build_subnetwork(model, a, 0, sdp.masking, path)
    params = dict(sub.named_parameters())
    kept = sum(t.numel() for t in params.values())
    trainable = sum(t.numel() for t in params.values() if t.requires_grad)

    def numel(piece) -> int:
        t = params[piece.local]
        return t.numel() if piece.dim is None else t.numel() // t.shape[piece.dim] * len(piece.local_index)

    buckets: dict[tuple, int] = {}
    for piece in pieces:
        if 0 in piece.holders:
            buckets[piece.holders] = buckets.get(piece.holders, 0) + numel(piece)
    comm = sum(_ring(len(h)) * 4 * n / shards for h, n in buckets.items())
    if sdp.masking == "backward":
        sets: dict[tuple, int] = {}
        for piece in pieces:
            sets[piece.holders] = sets.get(piece.holders, 0) + numel(piece)
        comm += sum(4 * n for h, n in sets.items() if len(h) < a.workers)
    if isinstance(sdp.sync, SDPPeriodSpec):  # else every_step
        comm /= sdp.sync.period
    if shards > 1:  # fp32 gathers per micro-batch (the root's once), one reduce-scatter
        root = kept - sum(t.numel() for block in blocks_at(sub, path) for t in block.parameters())
        gathered = spec.grad_accum_steps * gathered_per_micro_batch(kept, root, p.reshard_after_forward)
        comm += (gathered + kept) * 4 * (shards - 1) / shards
    return int((4 * kept + 12 * trainable) / shards), int(comm)
