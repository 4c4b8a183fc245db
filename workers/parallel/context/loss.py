"""The loss and gradients of a cp group: together they must equal the single-process ones.

Each rank holds some of the sequence's tokens. Its loss is the sum of its tokens' losses divided by the
GLOBAL token count (not its own), so the ranks' losses add up to the mean over the whole sequence. Each
rank's backward then gives the gradient of that sum through its own tokens (ring attention brings back
the key/value gradients other ranks' losses put on its tokens), and summing the parameter gradients over
the cp group (all-reduce SUM, as data parallelism does over its replicas) gives the single-process gradient.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist


def cp_mean_loss(loss_sum: torch.Tensor, token_count: int | torch.Tensor,
                 group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """This rank's share of the mean loss: `loss_sum` (its tokens' summed loss, e.g. cross_entropy with
    reduction='sum') over the token count of the whole cp group (count only targets that are not ignored).
    The group's shares add up to the mean; to report the mean, all-reduce (SUM) the detached shares."""
    total = torch.as_tensor(token_count, dtype=torch.float64, device=loss_sum.device).clone()
    dist.all_reduce(total, group=group)
    if total.item() == 0:
        raise ValueError("the cp group has no target tokens to average the loss over")
    return loss_sum / total.to(loss_sum.dtype)


def all_reduce_gradients(parameters: Iterable[torch.nn.Parameter], group: dist.ProcessGroup | None = None) -> None:
    """Sum the parameters' gradients over the cp group (one flat buffer, one collective)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    for grad, part in zip(grads, flat.split([g.numel() for g in grads])):
        grad.copy_(part.view_as(grad))
