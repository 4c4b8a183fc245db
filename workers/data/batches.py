"""The global batch at step s is a pure function of (seed, s).

It does not depend on the world size: sample position p = s * G + i walks
through seeded per-epoch permutations of the dataset, and rank r takes the
contiguous slice [r * G/dp, (r+1) * G/dp). Resuming at step s therefore needs
nothing but s, and resharding to another dp keeps the same global batch.

After a rollback the batches of the steps that went bad can be skipped: `skip`
lists windows [a, b) of batch numbers never to draw, and step s draws the s-th
batch that is not skipped, so steps from a on draw batches b, b+1, ... That is
still a pure function of (seed, s, skip), which the checkpoint records.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Protocol, Sequence

import torch

from workers.data.permutation import FeistelPermutation
from workers.model_io import collate

RANDPERM_LIMIT = 1 << 22  # samples; above it the permutation is computed per index (constant memory)


class MapDataset(Protocol):
    """A map-style dataset (torch's Dataset declares no __len__): what build_datasets returns."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


class GlobalBatches:
    def __init__(self, dataset: MapDataset, global_batch_size: int, seed: int,
                 skip: Sequence[Sequence[int]] | None = None, randperm_limit: int = RANDPERM_LIMIT):
        if len(dataset) == 0:
            raise ValueError("data: the dataset is empty")
        self.dataset, self.global_batch_size, self.seed = dataset, global_batch_size, seed
        self.randperm_limit = randperm_limit
        self.skip: list[tuple[int, int]] = []
        for a, b in skip or []:
            self.skip_window(a, b)

    def skip_window(self, start: int, end: int) -> None:
        """Never draw batches [start, end) (batch numbers, not steps); kept merged and sorted."""
        merged: list[tuple[int, int]] = []
        for a, b in sorted(self.skip + [(start, end)]):
            if b <= a:
                continue
            if merged and a <= merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], b))
            else:
                merged.append((a, b))
        self.skip = merged

    def batch_of(self, step: int) -> int:
        """The batch number that 0-based `step` draws: the step-th one outside the skipped windows."""
        batch = step
        for a, b in self.skip:  # disjoint and sorted: each window passed pushes the step past it
            if batch >= a:
                batch += b - a
        return batch

    @lru_cache(maxsize=2)
    def _permutation(self, epoch: int) -> torch.Tensor | FeistelPermutation:
        if len(self.dataset) > self.randperm_limit:
            return FeistelPermutation(len(self.dataset), self.seed * 1_000_003 + epoch)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(len(self.dataset), generator=g)

    def indices(self, step: int, start: int, count: int) -> list[int]:
        """Dataset indices of global-batch positions [start, start+count) at `step` (0-based)."""
        n = len(self.dataset)
        out = []
        batch = self.batch_of(step)
        for i in range(start, start + count):
            p = batch * self.global_batch_size + i
            out.append(int(self._permutation(p // n)[p % n]))
        return out

    def rank_microbatches(self, step: int, dp_rank: int, dp: int, micro_batch_size: int,
                          shares: list[int] | None = None):
        """Yield (inputs, targets) micro-batches of this data-parallel rank's slice.

        `shares` (samples per dp rank, summing to the global batch) gives uneven slices,
        used to take work off a straggler; the last micro-batch of a slice may be smaller.
        """
        for start, count in rank_slices(self.global_batch_size, dp_rank, dp, micro_batch_size, shares):
            yield collate([self.dataset[i] for i in self.indices(step, start, count)])


def rank_slices(global_batch_size: int, dp_rank: int, dp: int, micro_batch_size: int,
                shares: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """(start, count) global-batch positions of each micro-batch of this data-parallel rank."""
    shares = list(shares or [global_batch_size // dp] * dp)
    start, size = sum(shares[:dp_rank]), shares[dp_rank]
    return [(start + offset, min(micro_batch_size, size - offset)) for offset in range(0, size, micro_batch_size)]

