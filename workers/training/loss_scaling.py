"""Dynamic loss scaling for fp16 mixed precision.

fp16 has 5 exponent bits, so small gradients underflow to zero. The loss is
multiplied by a large power of two before backward and the gradients divided
by it before clipping and the optimiser step. A non-finite global gradient
norm is then first read as an overflow: the step is skipped and the scale
halved; every `growth_interval` clean steps it doubles. Only once the scale is
down to `min_scale` does a non-finite gradient count as a training fault (the
trainer's skip-and-roll-back rules). The decision rests on the global norm,
which every rank already agrees on, so it holds for every layout (torch's
GradScaler checks per device and needs a sharded variant per strategy).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.distributed.tensor import DTensor

INITIAL_SCALE = 2.0 ** 16
GROWTH_INTERVAL = 2000


@dataclass
class LossScaler:
    enabled: bool
    scale: float = INITIAL_SCALE
    growth_interval: int = GROWTH_INTERVAL
    min_scale: float = 1.0
    clean_steps: int = 0  # since the last overflow or growth
    overflows: int = 0

    @property
    def factor(self) -> float:
        return self.scale if self.enabled else 1.0

    @torch.no_grad()
    def unscale_(self, model: nn.Module) -> None:
        if not self.enabled:
            return
        inverse = 1.0 / self.scale  # a power of two: exact
        for p in model.parameters():
            if p.grad is not None:
                (p.grad._local_tensor if isinstance(p.grad, DTensor) else p.grad).mul_(inverse)

    def overflowed(self, grads_finite: bool) -> bool:
        """Record the step's outcome; True when it is an fp16 overflow to skip (and not a fault)."""
        if not self.enabled:
            return False
        if grads_finite:
            self.clean_steps += 1
            if self.clean_steps >= self.growth_interval:
                self.scale, self.clean_steps = self.scale * 2.0, 0
            return False
        if self.scale <= self.min_scale:
            return False  # no headroom left to blame: non-finite training
        self.scale, self.clean_steps = max(self.min_scale, self.scale / 2.0), 0
        self.overflows += 1
        return True

    def state_dict(self) -> dict:
        """Flat keys, recorded in a checkpoint's progress beside the step."""
        return {f"loss_scale_{k}": v for k, v in asdict(self).items() if k in PERSISTED}

    def load_state_dict(self, state: dict) -> None:
        for key in PERSISTED:
            if state.get(f"loss_scale_{key}") is not None:
                setattr(self, key, type(getattr(self, key))(state[f"loss_scale_{key}"]))


PERSISTED = ("scale", "clean_steps", "overflows")
