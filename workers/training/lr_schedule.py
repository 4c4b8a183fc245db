"""Learning rate as a pure function of the step (so a resumed run needs only the step)."""

import math

from workers.spec import TrainSpec


def lr_at(train: TrainSpec, step: int) -> float:
    """LR for 0-based optimizer step `step`: linear warmup, then cosine decay or constant."""
    if train.warmup_steps and step < train.warmup_steps:
        return train.lr * (step + 1) / train.warmup_steps
    if train.lr_schedule == "constant":
        return train.lr
    span = max(1, train.steps - train.warmup_steps)
    progress = min(1.0, (step - train.warmup_steps) / span)
    floor = train.lr * train.min_lr_ratio
    return floor + 0.5 * (train.lr - floor) * (1.0 + math.cos(math.pi * progress))
