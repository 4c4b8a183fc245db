"""The area under the ROC curve of a binary classifier's validation, over every data-parallel rank's share.

AUC is the probability that a random positive scores above a random negative (ties count a half): the
Mann-Whitney U statistic over the ranks of the scores, with tied scores given their average rank. It is
not a mean of per-batch figures, so the scores themselves are gathered before it is computed."""

from __future__ import annotations

import torch
import torch.distributed as dist


def roc_auc(scores: torch.Tensor, labels: torch.Tensor) -> float | None:
    """AUC of `scores` against 0/1 `labels` (1-D, same length); None when one class is absent."""
    scores, labels = scores.double().flatten(), labels.flatten() > 0.5
    positives = int(labels.sum())
    negatives = int(labels.numel()) - positives
    if positives == 0 or negatives == 0:
        return None
    order = torch.argsort(scores)
    sorted_scores = scores[order]
    ranks = torch.empty_like(scores)
    ranks[order] = torch.arange(1, scores.numel() + 1, dtype=torch.float64)
    # Tied scores share the mean of the ranks they span.
    _, inverse, counts = torch.unique_consecutive(sorted_scores, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).double()
    mean_rank = ends - (counts.double() - 1) / 2
    ranks[order] = mean_rank[inverse]
    u = float(ranks[labels].sum()) - positives * (positives + 1) / 2
    return u / (positives * negatives)


def gathered_auc(scores: list[torch.Tensor], labels: list[torch.Tensor],
                 group: dist.ProcessGroup | None) -> float | None:
    """AUC over the scores every rank of `group` (a CPU group; None: this rank alone) collected."""
    mine = torch.stack([torch.cat(scores).double().cpu(), torch.cat(labels).double().cpu()]) if scores else \
        torch.zeros(2, 0, dtype=torch.float64)
    if group is not None:
        everyone: list = [None] * dist.get_world_size(group)
        dist.all_gather_object(everyone, mine, group=group)
        mine = torch.cat(everyone, dim=1)
    return roc_auc(mine[0], mine[1])
