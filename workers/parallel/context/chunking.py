"""Load-balanced causal sharding of a sequence over the cp ranks.

Causal attention gives late tokens more work than early ones (token i attends to i + 1 keys), so cutting
the sequence into cp contiguous pieces would leave the last rank with most of the work. Instead the
sequence is cut into 2 x cp equal chunks and cp rank r holds chunks r and 2cp-1-r: an early and a late
chunk, the same causal work on every rank.
"""

from __future__ import annotations

import torch


def check_divisible(seq_len: int, cp: int) -> None:
    if cp < 1:
        raise ValueError(f"parallel.cp must be at least 1, got {cp}")
    if seq_len % (2 * cp):
        raise ValueError(
            f"context parallelism needs 2 x cp to divide the sequence length: data.seq_len {seq_len} is not a "
            f"multiple of 2 x parallel.cp = {2 * cp} (each rank holds two of 2 x cp equal chunks)")


def _chunk_ids(rank: int, cp: int) -> tuple[int, int]:
    if not 0 <= rank < cp:
        raise ValueError(f"cp rank {rank} is outside 0..{cp - 1}")
    return rank, 2 * cp - 1 - rank


def shard_sequence(x: torch.Tensor, dim: int, rank: int, cp: int) -> torch.Tensor:
    """This rank's part of `x` along `dim`: chunks r and 2cp-1-r of 2 x cp, concatenated in that order."""
    check_divisible(x.shape[dim], cp)
    chunks = x.chunk(2 * cp, dim)
    first, second = _chunk_ids(rank, cp)
    return torch.cat((chunks[first], chunks[second]), dim)


def sequence_positions(seq_len: int, rank: int, cp: int, device: torch.device | str | None = None) -> torch.Tensor:
    """The global positions (0..seq_len-1) of the tokens `shard_sequence` gives this rank, in its order."""
    check_divisible(seq_len, cp)
    size = seq_len // (2 * cp)
    first, second = _chunk_ids(rank, cp)
    return torch.cat((torch.arange(first * size, (first + 1) * size, device=device),
                      torch.arange(second * size, (second + 1) * size, device=device)))


def unshard_sequence(parts: list[torch.Tensor], dim: int) -> torch.Tensor:
    """The full sequence from every rank's part (`parts[r]` from cp rank r): the inverse of shard_sequence."""
    cp = len(parts)
    chunks: list[torch.Tensor | None] = [None] * (2 * cp)
    for rank, part in enumerate(parts):
        if part.shape[dim] % 2:
            raise ValueError(f"cp rank {rank}'s part has {part.shape[dim]} tokens along dim {dim}, not two equal "
                             f"chunks")
        first, second = _chunk_ids(rank, cp)
        chunks[first], chunks[second] = part.chunk(2, dim)
    return torch.cat([c for c in chunks if c is not None], dim)  # every chunk is set: each rank gave two
