"""The training loop's fixed points a strategy may take part in, beyond training a step: a typed capability.

Every strategy declares its `hooks` (workers/parallel/base.py's `Strategy`): `NO_HOOKS` where it adds nothing,
or an object overriding the points it needs. Each default does nothing or gives the plain answer, so the loop
(workers/training/) calls every hook unconditionally and never asks a strategy what it happens to have.

Who overrides what today: the parameter server (workers/parallel/parameter_server/strategy.py) saves and
restores its shards with the checkpoints, copies the shards' rows into the model before validation and
export, and adds its staleness and rows moved to each step record; SDP (workers/parallel/sdp/strategy.py)
assembles the whole model for validation and export and reports its masks in the final result; the
pipeline (workers/parallel/pipeline/strategy.py) gathers its stages for the export.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    from torch import nn

    from workers.parallel.control_group import ControlGroups
    from workers.storage import Storage


class LoopHooks:
    """No-op defaults; a strategy's hooks subclass this and override what they take part in."""

    @property
    def trains_alone(self) -> bool:
        """Whether the ranks never meet after their set-up (the parameter server's async mode): the loop then
        takes no collective (no agreement, checkpoints by `writes_for_all` alone, the finish by the lead), so a
        lost rank blocks no other."""
        return False

    def join_step(self) -> int:
        """Where a rank that joined a running job (StrategyContext.joining) starts: its first step's index."""
        return 0

    def writes_for_all(self, rank: int) -> bool:
        """Whether `rank` writes what one rank writes for the job: rank 0, unless the strategy says."""
        return rank == 0

    def wait_for_peers(self, steps: int) -> bool:
        """Ranks that train alone: wait until every live rank trained its `steps`; whether this one leads."""
        return True

    def after_load(self, storage: Storage, step: int, rank: int, control: ControlGroups) -> None:
        """The rank's model and optimiser were just loaded from the checkpoint of `step`."""

    def before_save(self, wrapped: nn.Module, storage: Storage, step: int, rank: int,
                    control: ControlGroups) -> None:
        """The checkpoint of `step` is about to be saved from `wrapped`."""

    def evaluation_model(self, wrapped: nn.Module) -> nn.Module:
        """The module validation runs (may be a collective): the one this rank trains, by default."""
        return wrapped

    def full_model_state(self, wrapped: nn.Module) -> dict[str, torch.Tensor]:
        """The whole model's state for the export, on every rank (a collective): DTensor shards gathered."""
        from workers.checkpointing import full_model_state

        return full_model_state(wrapped)

    def step_report(self) -> dict[str, object]:
        """What the step just trained adds to its step record (keys beside StepRecord's)."""
        return {}

    def final_report(self) -> dict[str, object]:
        """What the rank's final result adds (keys beside the step, validation and export)."""
        return {}


NO_HOOKS = LoopHooks()  # a strategy that takes part in none of the loop's fixed points
