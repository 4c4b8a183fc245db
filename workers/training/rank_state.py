"""What one rank's trainer holds, declared once: the state every part of the loop reads and writes.

The trainer (trainer.py) builds it; its parts are classes over it, one concept to a file: one optimizer
step (train_step.py), the checkpoints it resumes from and saves (checkpoints.py), validation
(evaluation.py) and the phases after the last step (finish.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import nn
    from torch.distributed.device_mesh import DeviceMesh

    from workers.checkpointing import Checkpointer
    from workers.data.batches import GlobalBatches
    from workers.data.loader import MapFeed
    from workers.data.stream import StreamFeed
    from workers.events import RunEvent
    from workers.models.moe_telemetry import ExpertLoad
    from workers.parallel.base import LossFn, Strategy, StrategyContext
    from workers.parallel.control_group import ControlGroups
    from workers.peak_flops import PeakFlops
    from workers.spec import JobSpec
    from workers.spec.dims import ParallelDims
    from workers.step_memory import StepMemory
    from workers.storage import Storage
    from workers.telemetry import CommMeter
    from workers.training.control import UnevenShares
    from workers.training.faults import FaultInjector
    from workers.training.loss_scaling import LossScaler
    from workers.training.progress import ProgressReporter
    from workers.training.recovery import LossSpikeDetector, RecoveryState
    from workers.training.shard_integrity import HeldStateCheck
    from workers.training.step_clock import StepClock


class RankState:
    # the job and this rank's place in it
    spec: JobSpec
    rank: int
    world_size: int
    device: torch.device
    dims: ParallelDims
    mesh: DeviceMesh | None  # None: a rank that joined a running job alone (Trainer `joining`)
    control_groups: ControlGroups  # host-side collectives: gloo, on GPU too
    dp: int
    dp_rank: int  # ranks that share a dp index see the same data (tensor/pipeline peers)
    accum: int
    storage: Storage  # the job's directory: a local one or on an object store
    # progress outside the steps, and what this rank saw before run() could emit it
    reporter: ProgressReporter
    notices: list[RunEvent]
    # meters
    clock: StepClock
    peak: PeakFlops
    comm: CommMeter
    memory: StepMemory
    expert_load: ExpertLoad | None
    model_params: int  # whole, before any sharding: for MFU
    model_state_bytes: int | None
    # data
    val_set: Any
    eval_batches: int | None
    batches: GlobalBatches | None  # map-style data: step s draws a pure function of (seed, s)
    feed: MapFeed | StreamFeed
    uneven: UnevenShares | None
    shares: list[int] | None  # samples per dp rank; None = even
    # the model as this rank trains it
    strategy: Strategy
    ctx: StrategyContext
    model: nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: LossFn
    scaler: LossScaler
    # where it is, and what went wrong so far
    step: int  # optimizer steps completed
    resumed_step: int  # the checkpoint this attempt resumed from
    steps_trained: int  # by this process (a restarted rank starts again at 0)
    skipped_in_a_row: int
    skip_reason: str | None  # why the last step's update was skipped
    recovery: RecoveryState | None
    spikes: LossSpikeDetector
    faults: FaultInjector
    held: HeldStateCheck
    checkpointer: Checkpointer
