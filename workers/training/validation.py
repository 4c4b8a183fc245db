"""Validation over the first `eval_batches` global batches of the validation split (or all of it),
summed over data-parallel ranks.

The samples are taken in rounds of dp x the evaluation batch (train.eval_micro_batch_size, default twice
the training micro-batch: no backward, so nothing is kept for a gradient); rank r evaluates its batch of
each round. Every rank runs the same number of forward passes (sharded and pipelined models communicate
in forward), so a rank whose share of the last round is short pads it with a sample that counts 0.
The loss is the mean over samples: sums of per-sample losses and counts, all-reduced.

How much is validated by default (DEFAULT_EVAL_BATCHES), and why: a forward without backward costs about
a third of a training sample (backward is twice the forward), so validating 8 global batches costs about
8/3 ~ 2.7 training steps, whatever the split's size: with `eval_every` >= 27 that is at most ~10% of the
training time, and the final validation is as bounded. The whole split is one `eval_batches: all` away
(text:pystdlib's is 12,500 windows: 781 global batches of 16, ~260 steps' worth).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, IterableDataset

from workers.data.loader import loader_options
from workers.model_io import call_model, collate, logits_of, to_device
from workers.spec import JobSpec
from workers.training.auc import gathered_auc
from workers.training.losses import LOSSES, one_logit

DEFAULT_EVAL_BATCHES = 8  # global batches per validation when train.eval_batches is left at "auto"
SAME_SET_EVAL_BATCHES = 2  # ... when the validation set is the training set (the whole would be an epoch)


@dataclass(frozen=True)
class Validation:
    """A validation's loss and what it covered: `samples` over every data-parallel rank, `batches` forward
    passes of `batch_size` samples on each rank, out of `split_samples` (None: a stream)."""

    loss: float
    samples: int
    batches: int
    batch_size: int
    split_samples: int | None
    auc: float | None = None  # a binary classifier's (train.loss 'bce'): over every rank's scores

    def as_record(self) -> dict:
        """The validation as a run records it: `auc` only for a binary classifier."""
        record = asdict(self)
        if self.auc is None:
            del record["auc"]
        return record


def eval_micro_batch_size(spec: JobSpec) -> int:
    return spec.train.eval_micro_batch_size or 2 * spec.train.micro_batch_size


def eval_batches_of(spec: JobSpec, train_set: Any, val_set: Any) -> int | None:
    """Global batches per validation (None: the whole split). train.eval_batches: a number as given; "auto"
    (the default) DEFAULT_EVAL_BATCHES, or SAME_SET_EVAL_BATCHES when there is no separate validation set
    (validating the whole training set would be a second epoch); "all" the whole split; null, as it always
    meant, the whole split (SAME_SET_EVAL_BATCHES without a separate one)."""
    asked = spec.train.eval_batches
    if isinstance(asked, int):
        return asked
    if asked == "all":
        return None
    if val_set is train_set:
        return SAME_SET_EVAL_BATCHES
    return DEFAULT_EVAL_BATCHES if asked == "auto" else None


def rank_batch_count(val_set: Any, spec: JobSpec, dp: int, max_batches: int | None) -> int | None:
    """Forward passes each rank runs in one validation (None: a stream of unknown length)."""
    try:
        n = len(val_set)
    except TypeError:
        if max_batches is None:
            return None
        n = max_batches * spec.train.global_batch_size
    if max_batches is not None:
        n = min(n, max_batches * spec.train.global_batch_size)
    return -(-n // (dp * eval_micro_batch_size(spec)))


def split_size(val_set: Any) -> int | None:
    try:
        return len(val_set)
    except TypeError:
        return None


@torch.no_grad()
def validation_sums(model, val_set: Any, spec: JobSpec, dp_rank: int, dp: int,
                    device: torch.device = torch.device("cpu"), max_batches: int | None = None,
                    progress: Callable[[int], None] | None = None, shard=None,
                    scores: tuple[list, list] | None = None) -> tuple[float, int]:
    """(sum of per-sample losses, samples) of this rank's share; `progress(batches done)` after each batch;
    `shard(inputs, targets)`: a context-parallel rank's chunks of each sequence (its loss, the mean over its
    equal share of tokens, is summed over the cp ranks with their samples: the same mean); `scores`: lists the
    real samples' logits and targets are appended to (a binary classifier's AUC)."""
    model.eval()
    total, count = 0.0, 0
    for done, (batch, real) in enumerate(_rank_batches(val_set, spec, dp_rank, dp, device, max_batches), 1):
        inputs, targets = to_device(batch, device)
        if shard is not None:
            inputs, targets = shard(inputs, targets)
        output = call_model(model, inputs, with_labels=spec.train.loss == "model")
        m = int(targets.shape[0]) if targets is not None else real
        if real and real < m and spec.train.loss != "model":  # drop the padding rows
            loss = LOSSES[spec.train.loss](logits_of(output)[:real], targets[:real] if targets is not None else None)
        else:
            loss = LOSSES[spec.train.loss](output, targets)
        total, count = total + float(loss) * real, count + real
        if scores is not None and targets is not None:
            scores[0].append(one_logit(logits_of(output), targets)[:real].float().cpu())
            scores[1].append(targets[:real].float().cpu())
        if progress is not None:
            progress(done)
    model.train()
    return total, count


def validate(model, val_set: Any, spec: JobSpec, dp_rank: int, dp: int,
             device: torch.device = torch.device("cpu"), max_batches: int | None = None,
             group: dist.ProcessGroup | None = None, progress: Callable[[int], None] | None = None,
             shard=None) -> Validation:
    """The mean validation loss over all data-parallel ranks (`group`: their process group, with the cp
    ranks under context parallelism; None: this rank's share alone) and what it covered."""
    batches = [0]

    def counted(done: int) -> None:
        batches[0] = done
        if progress is not None:
            progress(done)

    scores: tuple[list, list] | None = ([], []) if spec.train.loss == "bce" else None
    total, count = validation_sums(model, val_set, spec, dp_rank, dp, device, max_batches, counted, shard, scores)
    if group is not None:
        sums = torch.tensor([total, float(count)], dtype=torch.float64)  # host values: `group` is a CPU group
        dist.all_reduce(sums, group=group)
        total, count = float(sums[0]), int(sums[1])
    auc = gathered_auc(*scores, group) if scores is not None else None
    return Validation(total / max(count, 1), count, batches[0], eval_micro_batch_size(spec), split_size(val_set),
                      auc)


def validation_loss(model, val_set: Any, spec: JobSpec, dp_rank: int, dp: int,
                    device: torch.device = torch.device("cpu"), max_batches: int | None = None,
                    group: dist.ProcessGroup | None = None) -> float:
    """The mean validation loss over all data-parallel ranks (validate(), its loss alone)."""
    return validate(model, val_set, spec, dp_rank, dp, device, max_batches, group).loss


def _rank_batches(val_set: Any, spec: JobSpec, dp_rank: int, dp: int, device: torch.device,
                  max_batches: int | None) -> Iterator[tuple[Any, int]]:
    """(micro-batch, real samples in it) of this rank, round after round."""
    mb, cap = eval_micro_batch_size(spec), (max_batches * spec.train.global_batch_size if max_batches else None)
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
