"""Validation over the whole validation split (or its first `max_batches` global batches), summed
over data-parallel ranks.

The samples are taken in rounds of dp x micro_batch_size; rank r evaluates its micro-batch of each
round. Every rank runs the same number of forward passes (sharded and pipelined models communicate
in forward), so a rank whose share of the last round is short pads it with a sample that counts 0.
The loss is the mean over samples: sums of per-sample losses and counts, all-reduced.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset

from workers.data.loader import loader_options
from workers.model_io import call_model, collate, logits_of, to_device
from workers.spec import JobSpec
from workers.training.losses import LOSSES


@torch.no_grad()
def validation_sums(model, val_set: Any, spec: JobSpec, dp_rank: int, dp: int,
                    device: torch.device = torch.device("cpu"), max_batches: int | None = None) -> tuple[float, int]:
    """(sum of per-sample losses, samples) of this rank's share."""
    model.eval()
    total, count = 0.0, 0
    for batch, real in _rank_batches(val_set, spec, dp_rank, dp, device, max_batches):
        inputs, targets = to_device(batch, device)
        output = call_model(model, inputs, with_labels=spec.train.loss == "model")
        m = int(targets.shape[0]) if targets is not None else real
        if real and real < m and spec.train.loss != "model":  # drop the padding rows
            loss = LOSSES[spec.train.loss](logits_of(output)[:real], targets[:real] if targets is not None else None)
        else:
            loss = LOSSES[spec.train.loss](output, targets)
        total, count = total + float(loss) * real, count + real
    model.train()
    return total, count


def eval_batches_of(spec: JobSpec, train_set: Any, val_set: Any) -> int | None:
    """train.eval_batches; unset, the whole validation split, or 2 batches when there is no separate one
    (validating the whole training set would be a second epoch)."""
    return spec.train.eval_batches or (2 if val_set is train_set else None)


def validation_loss(model, val_set: Any, spec: JobSpec, dp_rank: int, dp: int,
                    device: torch.device = torch.device("cpu"), max_batches: int | None = None,
                    group: dist.ProcessGroup | None = None) -> float:
    """The mean validation loss over all data-parallel ranks (`group`: their process group; None: this
    rank's share alone)."""
    total, count = validation_sums(model, val_set, spec, dp_rank, dp, device, max_batches)
    if group is not None and dp > 1:
        sums = torch.tensor([total, float(count)], dtype=torch.float64)  # host values: `group` is a CPU group
        dist.all_reduce(sums, group=group)
        total, count = float(sums[0]), int(sums[1])
    return total / max(count, 1)


def _rank_batches(val_set: Any, spec: JobSpec, dp_rank: int, dp: int, device: torch.device,
                  max_batches: int | None) -> Iterator[tuple[Any, int]]:
    """(micro-batch, real samples in it) of this rank, round after round."""
    mb, cap = spec.train.micro_batch_size, (max_batches * spec.train.global_batch_size if max_batches else None)
    if isinstance(val_set, IterableDataset):
        stream = itertools.islice(iter(val_set), cap)
        while rnd := list(itertools.islice(stream, dp * mb)):
            mine = rnd[dp_rank * mb:(dp_rank + 1) * mb]
            yield collate(mine + [rnd[0]] * (mb - len(mine)) if len(mine) < mb else mine), len(mine)
        return
    n = len(val_set)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(spec.train.seed + 1)).tolist()[:cap]
    lists, reals = [], []
    for first in range(0, len(order), dp * mb):
        rnd = order[first:first + dp * mb]
        mine = rnd[dp_rank * mb:(dp_rank + 1) * mb]
        lists.append(mine + [rnd[0]] * (min(mb, len(rnd)) - len(mine)) if len(mine) < min(mb, len(rnd)) else mine)
        reals.append(len(mine))
    options = loader_options(spec.data.loader, device, spec.train.seed + 1)
    loader = DataLoader(val_set, batch_sampler=lists, collate_fn=collate, **options)
    yield from zip(loader, reals)
