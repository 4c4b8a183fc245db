"""torch DataLoaders that prepare a rank's micro-batches off the training thread.

A map-style dataset is read through a batch sampler that yields this rank's micro-batch index
lists step after step (GlobalBatches decides them, so step s is the same whatever num_workers
and the world size). Loader workers fetch and collate ahead, `prefetch_factor` micro-batches
each; the sampler runs in the rank, so a change of shares or a resume restarts the iterator.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, Sampler

from workers.data.batches import GlobalBatches, rank_slices
from workers.model_io import Batch, collate
from workers.spec.data import LoaderSpec


def loader_options(loader: LoaderSpec, device: torch.device, seed: int) -> dict[str, Any]:
    """DataLoader keyword arguments; its own generator, so that starting workers never draws from
    the global RNG the training step reseeds (a resumed run would draw at another step)."""
    workers = loader.num_workers
    pin = device.type == "cuda" if loader.pin_memory == "auto" else bool(loader.pin_memory)
    return {"num_workers": workers, "prefetch_factor": loader.prefetch_factor if workers else None,
            "pin_memory": pin and torch.cuda.is_available(), "generator": torch.Generator().manual_seed(seed),
            "persistent_workers": False}


class StepMicroBatches(Sampler[list[int]]):
    """Index lists of a rank's micro-batches for steps first_step, first_step + 1, ... (endless)."""

    def __init__(self, batches: GlobalBatches, first_step: int, dp_rank: int, dp: int, micro_batch_size: int,
                 shares: Sequence[int] | None):
        self.batches, self.first_step = batches, first_step
        self.slices = rank_slices(batches.global_batch_size, dp_rank, dp, micro_batch_size, shares)

    def __iter__(self) -> Iterator[list[int]]:
        step = self.first_step
        while True:
            for start, count in self.slices:
                yield self.batches.indices(step, start, count)
            step += 1


class MapFeed:
    """A rank's micro-batches of step s from a map-style dataset, prepared by loader workers."""

    def __init__(self, batches: GlobalBatches, loader: LoaderSpec, device: torch.device, dp_rank: int, dp: int,
                 micro_batch_size: int):
        self.batches, self.dp_rank, self.dp, self.micro = batches, dp_rank, dp, micro_batch_size
        self.options = loader_options(loader, device, batches.seed)
        self._iter: Iterator[Batch] | None = None
        self._next_step, self._per_step = -1, 0
        self._shares: tuple[int, ...] | None = None

    def micro_batches(self, step: int, shares: Sequence[int] | None = None) -> list[Batch]:
        key = tuple(shares) if shares else None
        if self._iter is None or step != self._next_step or key != self._shares:
            self._start(step, key)
        assert self._iter is not None
        self._next_step = step + 1
        return [next(self._iter) for _ in range(self._per_step)]

    def _start(self, step: int, shares: tuple[int, ...] | None) -> None:
        self.close()
        sampler = StepMicroBatches(self.batches, step, self.dp_rank, self.dp, self.micro, shares)
        self._per_step, self._shares = len(sampler.slices), shares
        loader: DataLoader = DataLoader(self.batches.dataset, batch_sampler=sampler,  # type: ignore[arg-type]
                                        collate_fn=collate, **self.options)
        self._iter = iter(loader)

    def state_dict(self) -> dict[str, int]:
        return {}  # the position is the step (GlobalBatches): nothing else to save

    def close(self) -> None:
        it, self._iter = self._iter, None
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()  # now, not when the garbage collector finds it
