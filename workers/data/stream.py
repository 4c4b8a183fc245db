"""An IterableDataset as a stream of global batches, resumable from a saved sample count.

Step s takes the next global_batch_size samples of the stream (a rank keeps its slice), and
the stream starts again when it ends. With loader workers, worker w yields samples w, w + k,
w + 2k, ... of the stream and DataLoader takes them round-robin, so the order is the stream's
own whatever num_workers is (each worker reads the stream; the dataset must not split itself by
worker). The feed's state is the number of samples consumed; the checkpoint records it and a
resumed run replays the stream to that position (or a dataset's own `skip(n)`, where it has one); a
stream without `__len__` resumes within its first pass only.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from workers.data.batches import rank_slices
from workers.data.errors import DataError
from workers.data.loader import loader_options
from workers.model_io import Batch, collate
from workers.spec.data import LoaderSpec


class WorkerShare(IterableDataset):
    """This loader worker's every k-th sample of the user's stream, from position `start` on."""

    def __init__(self, dataset: IterableDataset, start: int):
        self.dataset, self.start = dataset, start

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, k = (info.id, info.num_workers) if info is not None else (0, 1)
        return itertools.islice(skipped(self.dataset, self.start), worker, None, k)


def skipped(dataset: Any, n: int) -> Iterator[Any]:
    if n and hasattr(dataset, "skip"):
        return iter(dataset.skip(n))
    return itertools.islice(iter(dataset), n, None)


class StreamFeed:
    def __init__(self, dataset: IterableDataset, global_batch_size: int, loader: LoaderSpec,
                 device: torch.device, seed: int, dp_rank: int, dp: int, micro_batch_size: int):
        self.dataset, self.global_batch_size = dataset, global_batch_size
        self.dp_rank, self.dp, self.micro = dp_rank, dp, micro_batch_size
        self.options = loader_options(loader, device, seed)
        self.samples = 0  # consumed so far: the loader state a checkpoint records
        self._iter: Iterator[Any] | None = None

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.close()
        self.samples = int(state.get("samples", 0))

    def state_dict(self) -> dict[str, int]:
        return {"samples": self.samples}

    def micro_batches(self, step: int, shares: Sequence[int] | None = None) -> list[Batch]:
        del step  # the stream's position is the sample count, which the checkpoint restores
        batch = [self._next() for _ in range(self.global_batch_size)]
        self.samples += self.global_batch_size
        return [collate(batch[start:start + count])
                for start, count in rank_slices(self.global_batch_size, self.dp_rank, self.dp, self.micro, shares)]

    def _next(self) -> Any:
        if self._iter is None:
            self._iter = self._start(self.samples)
        try:
            return next(self._iter)
        except StopIteration:
            self._iter = self._start(0)  # a new pass over the stream
        try:
            return next(self._iter)
        except StopIteration:
            raise DataError(type(self.dataset).__name__, 0, "the IterableDataset yielded no sample") from None

    def _start(self, position: int) -> Iterator[Any]:
        """An iterator from `position` of the stream (within its pass, where the dataset has a length)."""
        self.close()
        if hasattr(self.dataset, "__len__") and len(self.dataset):  # type: ignore[arg-type]
            position %= len(self.dataset)  # type: ignore[arg-type]
        loader = DataLoader(WorkerShare(self.dataset, position), batch_size=None, **self.options)
        return iter(loader)

    def close(self) -> None:
        it, self._iter = self._iter, None
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
