"""The one interface every parallel strategy implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ContextManager, Protocol

import torch
from torch import nn

from workers.telemetry import CommMeter


@dataclass(frozen=True)
class StrategyContext:
    rank: int
    world_size: int
    dp_rank: int
    dp: int
    device: torch.device
    comm: CommMeter


class Strategy(Protocol):
    name: str

    def wrap(self, model: nn.Module, ctx: StrategyContext) -> nn.Module:
        """Return the module that forward/backward run on (it owns gradient sync)."""

    def no_sync(self, wrapped: nn.Module) -> ContextManager:
        """Context that skips gradient sync (every micro-batch but the last)."""

    def unwrap(self, wrapped: nn.Module) -> nn.Module:
        """The plain module whose state dict is checkpointed and exported."""


