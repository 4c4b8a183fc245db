"""Silent data corruption: ranks that must hold identical state compare a digest of it.

Each rank digests what its strategy declares replicated (workers/parallel/replicas.py):
its own local shards, never a gathered tensor. One all-gather over the whole job
shares every rank's (ranks, digest) pairs, so every rank reaches the same verdict at
the same step, also ranks whose own groups agree (a lone raise would leave peers
waiting in the next collective).
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Iterable

import torch
import torch.distributed as dist

from workers.events import RestartCause
from workers.parallel.control_group import ControlGroups
from workers.parallel.replicas import ReplicaGroup


class SilentDataCorruption(RuntimeError):
    """Replicas that must be identical are not: the supervisor restores the last checkpoint."""

    restart_cause = RestartCause.CORRUPTION


def tensor_digest(tensors: Iterable[torch.Tensor]) -> int:
    """CRC32 of the tensors' bytes, in order (bit-exact: one flipped bit changes it)."""
    crc = 0
    for t in tensors:
        crc = zlib.crc32(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes(), crc)
    return crc


def odd_ranks(held: dict[int, int]) -> list[int]:
    """The ranks whose digest is not the majority's; every rank when no digest has a majority."""
    counts = Counter(held.values()).most_common()
    if len(counts) == 1:
        return []
    if counts[0][1] == counts[1][1]:
        return sorted(held)
    return sorted(r for r, d in held.items() if d != counts[0][0])


def disagreements(reports: list[list[tuple[tuple[int, ...], int]]]) -> list[int]:
    """The odd ranks over every replica group, from each rank's [(group ranks, digest)]."""
    groups: dict[tuple[int, ...], dict[int, int]] = {}
    for rank, pairs in enumerate(reports):
        for ranks, digest in pairs:
            groups.setdefault(ranks, {})[rank] = digest
    return sorted({r for held in groups.values() for r in odd_ranks(held)})


def check_replicas(groups: list[ReplicaGroup], step: int, control: ControlGroups) -> None:
    """Collective over the job: raise SilentDataCorruption naming the odd ranks if any group disagrees."""
    mine = [(g.ranks, tensor_digest(g.tensors)) for g in groups]
    reports: list = [None] * dist.get_world_size()
    control.all_gather_object(reports, mine)  # host digests: the CPU group
    odd = disagreements(reports)
    if odd:
        raise SilentDataCorruption(f"replicas disagree on their parameters at step {step} "
                                   f"(odd ranks: {odd}): restoring the last checkpoint")
