"""Loss registry, keyed by `train.loss`. Every loss takes the model's raw output and the targets.

Conventions (docs/models.md): `cross_entropy` takes class-last logits `(..., classes)` and
integer targets of the logits' shape without the last dimension; `mse` takes outputs of the
targets' shape; `model` is the loss the model returned itself (batches that carry its labels).
"""

from typing import Any, Callable

import torch
from torch.nn import functional as F

from workers.model_io import UserModelError, logits_of, model_loss


def _needs_targets(loss: str, targets: torch.Tensor | None) -> torch.Tensor:
    if targets is None:
        raise UserModelError(f"train.loss {loss!r} needs targets: the batches have none (a dict sample without "
                             f"'labels'); use train.loss 'model' for a model that computes its own loss")
    return targets


def cross_entropy(outputs: Any, targets: torch.Tensor | None) -> torch.Tensor:
    targets = _needs_targets("cross_entropy", targets)
    logits = logits_of(outputs)
    if logits.shape[:-1] != targets.shape:
        raise UserModelError(
            f"train.loss 'cross_entropy' takes class-last logits (..., classes) whose leading dimensions are the "
            f"targets' shape: the model returned logits of shape {tuple(logits.shape)} for targets of shape "
            f"{tuple(targets.shape)} (a (batch, classes, time) output must be transposed to (batch, time, classes))")
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def mse(outputs: Any, targets: torch.Tensor | None) -> torch.Tensor:
    targets = _needs_targets("mse", targets)
    predictions = logits_of(outputs)
    if predictions.shape != targets.shape:
        raise UserModelError(f"train.loss 'mse' takes outputs of the targets' shape: the model returned "
                             f"{tuple(predictions.shape)} for targets of shape {tuple(targets.shape)}")
    return F.mse_loss(predictions, targets)


def bce(outputs: Any, targets: torch.Tensor | None) -> torch.Tensor:
    """Binary cross-entropy with logits: one logit per sample, (batch,) or (batch, 1), against 0/1 targets."""
    targets = _needs_targets("bce", targets)
    logits = one_logit(logits_of(outputs), targets)
    return F.binary_cross_entropy_with_logits(logits, targets.to(logits.dtype))


def one_logit(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The logits in the targets' shape: a trailing dimension of one dropped."""
    if logits.shape != targets.shape and logits.shape == (*targets.shape, 1):
        logits = logits.squeeze(-1)
    if logits.shape != targets.shape:
        raise UserModelError(f"train.loss 'bce' takes one logit per sample: the model returned {tuple(logits.shape)} "
                             f"for targets of shape {tuple(targets.shape)}")
    return logits


def own_loss(outputs: Any, targets: torch.Tensor | None) -> torch.Tensor:
    return model_loss(outputs)


LOSSES: dict[str, Callable[[Any, torch.Tensor | None], torch.Tensor]] = {
    "cross_entropy": cross_entropy,
    "mse": mse,
    "bce": bce,
    "model": own_loss,
}
