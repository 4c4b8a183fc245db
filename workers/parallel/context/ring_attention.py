"""Causal attention over a sequence sharded by chunking.shard_sequence: ring attention.

Each cp rank keeps its queries and passes its keys/values around the ring (cp-1 hops), so every query
meets every key once without any rank holding the whole sequence. The partial results of the key blocks
are merged with the online-softmax (log-sum-exp) rule: a running row maximum m, a running sum of
exp(score - m) and an output accumulator, rescaled whenever m grows. The causal mask compares the GLOBAL
positions of the queries with those of the travelling keys (sequence_positions of the block's owner).

The backward runs the ring again: with the forward's output O and log-sum-exp L saved, each key block's
probabilities are recomputed as exp(S - L) (no score matrix is kept), the query gradient accumulates
locally, and the key/value gradients travel with their block and arrive back at their owner after one last
hop. Keys/values may have fewer heads than queries (grouped-query attention): blocks travel compact and are
expanded only for the local product. Both directions compute a tile of query rows against one of the key
block's two chunks at a time, and skip the pairs the causal mask hides: memory grows with the rank's
sequence, not with its square.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from workers.parallel.context.chunking import sequence_positions
from workers.parallel.context.ring import ring_shift

_KV, _GRAD = 0, 1  # ring_shift tags: the backward has a block and its gradients in flight at once
TILE_ROWS = 128  # query rows whose scores exist at once (x a key chunk, x heads)


def _expand(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """[b, kv_heads, t, d] -> [b, heads, t, d]: each key/value head serves `group_size` consecutive query heads."""
    return x if group_size == 1 else x.repeat_interleave(group_size, dim=1)


def _fold(grad: torch.Tensor, group_size: int) -> torch.Tensor:
    """The inverse of _expand for gradients: sum over the query heads that shared a key/value head."""
    if group_size == 1:
        return grad
    b, h, t, d = grad.shape
    return grad.view(b, h // group_size, group_size, t, d).sum(2)


def _visible_tiles(q_pos: torch.Tensor, k_pos: torch.Tensor):
    """(query rows, key columns) slices to compute: query tiles of TILE_ROWS rows against each of the key
    block's two chunks, leaving out the pairs the causal mask hides entirely. Only a tile's scores exist at
    a time, so a rank's attention memory grows with its sequence, not with its square."""
    queries, keys = q_pos.tolist(), k_pos.tolist()  # host ints: one transfer per block, none per tile
    half = len(keys) // 2
    chunks = [slice(0, half), slice(half, len(keys))]
    first = [keys[c.start] for c in chunks]  # a chunk's positions are consecutive
    for start in range(0, len(queries), TILE_ROWS):
        rows = slice(start, min(start + TILE_ROWS, len(queries)))
        last_query = max(queries[rows])
        for cols, first_key in zip(chunks, first):
            if first_key <= last_query:
                yield rows, cols


def _scores(q, k, q_pos, k_pos, scale) -> torch.Tensor:
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    return s.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, group, scale):
        rank, cp = dist.get_rank(group), dist.get_world_size(group)
        dtypes, work = (q.dtype, k.dtype, v.dtype), torch.promote_types(q.dtype, torch.float32)
        q, k, v = q.to(work), k.to(work), v.to(work)
        t, group_size = q.shape[2], q.shape[1] // k.shape[1]
        q_pos = sequence_positions(t * cp, rank, cp, q.device)

        m = torch.full(q.shape[:3], float("-inf"), dtype=work, device=q.device)
        total = torch.zeros_like(m)
        acc = torch.zeros_like(q)
        kv = torch.stack((k, v))
        for step in range(cp):
            pending = ring_shift(kv, group, _KV) if step < cp - 1 else None  # next block arrives during the math
            k_pos = sequence_positions(t * cp, (rank - step) % cp, cp, q.device)
            k_b, v_b = _expand(kv[0], group_size), _expand(kv[1], group_size)
            for rows, cols in _visible_tiles(q_pos, k_pos):
                s = _scores(q[:, :, rows], k_b[:, :, cols], q_pos[rows], k_pos[cols], scale)
                m_old = m[..., rows]
                new_m = torch.maximum(m_old, s.amax(-1))
                safe_m = new_m.masked_fill(new_m == float("-inf"), 0.0)  # a row with no visible key yet: no NaN
                p = torch.exp(s - safe_m[..., None])
                rescale = torch.exp(m_old - safe_m)
                total[..., rows] = total[..., rows] * rescale + p.sum(-1)
                acc[:, :, rows] = acc[:, :, rows] * rescale[..., None] + torch.matmul(p, v_b[:, :, cols])
                m[..., rows] = new_m
            if pending is not None:
                kv = pending()
        # every query sees at least itself (its own block, step 0), so the sum is > 0
        out = acc / total[..., None]
        lse = m + torch.log(total)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.scale, ctx.dtypes = group, scale, dtypes
        return out.to(dtypes[0])

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        group, scale = ctx.group, ctx.scale
        rank, cp = dist.get_rank(group), dist.get_world_size(group)
        t, group_size = q.shape[2], q.shape[1] // k.shape[1]
        q_pos = sequence_positions(t * cp, rank, cp, q.device)
        dout = grad_out.to(q.dtype)
        delta = (dout * out).sum(-1, keepdim=True)  # rowsum(dO * O) = rowsum(P * dP)

        dq = torch.zeros_like(q)
        kv = torch.stack((k, v))
        dkv = torch.zeros_like(kv)  # gradients of the block held now, travelling with it
        for step in range(cp):
            pending = ring_shift(kv, group, _KV) if step < cp - 1 else None
            k_pos = sequence_positions(t * cp, (rank - step) % cp, cp, q.device)
            k_b, v_b = _expand(kv[0], group_size), _expand(kv[1], group_size)
            dk_b, dv_b = torch.zeros_like(k_b), torch.zeros_like(v_b)
            for rows, cols in _visible_tiles(q_pos, k_pos):
                q_t, do_t = q[:, :, rows], dout[:, :, rows]
                p = torch.exp(_scores(q_t, k_b[:, :, cols], q_pos[rows], k_pos[cols], scale)
                              - lse[:, :, rows, None])  # masked: exp(-inf) = 0
                dp = torch.matmul(do_t, v_b[:, :, cols].transpose(-2, -1))
                ds = p * (dp - delta[:, :, rows]) * scale
                dq[:, :, rows] += torch.matmul(ds, k_b[:, :, cols])
                dk_b[:, :, cols] += torch.matmul(ds.transpose(-2, -1), q_t)
                dv_b[:, :, cols] += torch.matmul(p.transpose(-2, -1), do_t)
            dkv = dkv + torch.stack((_fold(dk_b, group_size), _fold(dv_b, group_size)))
            if cp > 1:
                # after the last step the block held is rank r+1's: one more hop takes its gradients home
                dkv = ring_shift(dkv, group, _GRAD)()
            if pending is not None:
                kv = pending()
        dk, dv = dkv[0], dkv[1]
        return dq.to(ctx.dtypes[0]), dk.to(ctx.dtypes[1]), dv.to(ctx.dtypes[2]), None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: dist.ProcessGroup | None = None, *,
                   scale: float | None = None, dropout_p: float = 0.0) -> torch.Tensor:
    """Causal attention of this cp rank's queries over the whole sharded sequence.

    q: [batch, heads, t_local, head_dim]; k, v: [batch, kv_heads, t_local, head_dim] with kv_heads dividing
    heads. t_local is this rank's shard, chunks r and 2cp-1-r of the sequence (chunking.shard_sequence),
    so the sequence length is t_local x cp. `group`: the cp ranks (None: the default group); every rank of
    it must call this (and later run its backward) the same number of times. Returns [batch, heads,
    t_local, head_dim] in q's dtype, equal to this rank's rows of causal scaled_dot_product_attention over
    the unsharded sequence. Accumulates in float32 at least.
    """
    if dropout_p:
        raise ValueError(f"context parallelism needs model.dropout 0 (attention dropout {dropout_p}): ring "
                         f"attention does not drop attention weights")
    if q.dim() != 4 or k.shape != v.shape or k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(f"ring_attention takes q [b, heads, t, d] and k, v [b, kv_heads, t, d] with kv_heads "
                         f"dividing heads; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[2] % 2:
        raise ValueError(f"a cp rank holds two equal chunks of the sequence; {q.shape[2]} local tokens is odd")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    return _RingAttention.apply(q, k, v, group, scale)
