"""The training loop of one rank: build, resume, step, checkpoint, finish (final validation and export).

Determinism: the model is built from `train.seed`; the global batch of step s is
a pure function of (seed, s); the learning rate is a pure function of s; RNG is
reseeded from (seed, s, rank) every step; DDP reduces buckets in a fixed order.
So a run resumed from a checkpoint at the same world size ends bit-identical to
the uninterrupted run, which `params_sha256` proves.

This file builds the rank (`Trainer.__init__`) and runs the loop (`run`); the loop's parts are one concept to
a file over the state the trainer holds (rank_state.py): one optimizer step (train_step.py), the checkpoints
it resumes from and saves (checkpoints.py), validation (evaluation.py) and the phases after the last step
(finish.py). What a strategy adds at the loop's fixed points it declares as typed hooks
(workers/parallel/loop_hooks.py), which the loop calls whatever the strategy.
"""

from __future__ import annotations

import os
from typing import Callable

import torch
from torch.utils.data import IterableDataset

from workers import checkpointing
from workers.data import build_datasets
from workers.data.batches import GlobalBatches
from workers.data.loader import MapFeed
from workers.data.stream import StreamFeed
from workers.events import RankEvent, RankNotice, RankShares, RankStep
from workers.models import build_model
from workers.models.moe_loss import with_aux_loss
from workers.models.moe_telemetry import expert_load
from workers.parallel import StrategyContext, build_strategy
from workers.parallel.control_group import ControlGroups
from workers.parallel.mesh import build_mesh
from workers.peak_flops import peak_flops
from workers.phases import Phase, Progress
from workers.spec import JobSpec
from workers.step_memory import StepMemory
from workers.storage import Storage
from workers.telemetry import CommMeter
from workers.training.checkpoints import init_source
from workers.training.control import RankControl, UnevenShares, agreement_due
from workers.training.faults import FaultInjector
from workers.training.finish import Finishing
from workers.training.integrity import SilentDataCorruption
from workers.training.loss_scaling import LossScaler
from workers.training.losses import LOSSES
from workers.training.out_of_memory import is_out_of_memory, out_of_memory
from workers.training.progress import ProgressReporter, report_interval_s
from workers.training.recovery import LossSpikeDetector, NonFiniteTraining, RecoveryState
from workers.training.shard_integrity import HeldStateCheck
from workers.training.step_clock import clock_for
from workers.training.validation import eval_batches_of

# Imported from here by the runtime, the tests and the benches: the trainer, its rollback and corruption errors,
# and where `train.init_from` reads.
__all__ = ["NonFiniteTraining", "SilentDataCorruption", "Trainer", "init_source"]


class Trainer(Finishing):
    def __init__(self, spec: JobSpec, rank: int, world_size: int, device: torch.device,
                 job: Storage | str | os.PathLike, uneven: UnevenShares | None = None,
                 reporter: ProgressReporter | None = None, nodes: tuple[str, ...] = (), joining: bool = False):
        """`joining`: this rank joins a running job alone, in a process group of its own (the parameter
        server's async trainers: an elastic join); `rank` and `world_size` are still its place in the job."""
        self.spec, self.rank, self.world_size, self.device = spec, rank, world_size, device
        # Progress outside the steps (set-up, validation, checkpoint bytes, export): the supervisor's hang
        # timer runs on it (workers/training/progress.py); held until run() has somewhere to send it.
        self.reporter = reporter or ProgressReporter(rank, report_interval_s(spec.fault_tolerance.hang_timeout_s))
        self.resumed_step = 0  # the checkpoint this attempt resumed from
        self.storage = Storage.of(job)  # the job's directory: a local one or on an object store
        self.notices = []  # what this rank saw before run() could emit it
        self.dims = spec.dims
        self.joining = joining
        self.mesh = build_mesh(self.dims, device.type) if not joining else None  # a world of one: no mesh
        self.control_groups = ControlGroups()  # host-side collectives: gloo, on GPU too
        # Ranks that share a dp index see the same data (tensor/pipeline peers).
        self.dp, self.dp_rank = self.dims.dp, self.dims.coordinates(rank)["dp"]
        if self.dims.size("dp_cp") > 1 and not joining:  # every rank together: the validation loss is summed on the CPU
            self.control_groups.mirror(self.dims, "dp_cp")
        self.accum = spec.grad_accum_steps
        self.clock = clock_for(device)  # host time on CPU, CUDA events on GPU
        self.peak = peak_flops(device, half=spec.parallel.mixed_precision != "fp32")  # for MFU
        self.comm = CommMeter(self.clock if device.type == "cuda" else None)
        self.loss_fn = LOSSES[spec.train.loss]
        self.faults = FaultInjector(spec.fault_injection, rank, self.storage)
        self.step = 0  # optimizer steps completed
        self.skipped_in_a_row = 0
        self.skip_reason = None  # why the last step's update was skipped
        # Rollbacks so far: data windows never to draw again and the LR factor (workers/training/recovery.py).
        self.recovery = RecoveryState.load(self.storage)
        self.spikes = LossSpikeDetector(spec.fault_tolerance.loss_spike)
        self.scaler = LossScaler(enabled=spec.parallel.mixed_precision == "fp16")
        self.uneven = uneven  # granted by the supervisor: the data split may change at agreement steps
        self.shares = list(uneven.start) if uneven is not None and uneven.start else None  # None = even
        self.model_state_bytes = None
        self.steps_trained = 0  # by this process (a restarted rank starts again at 0)

        opening = self.reporter.phase(Phase.OPENING_DATA, total=1)
        train_set, self.val_set = build_datasets(spec)
        self.eval_batches = eval_batches_of(spec, train_set, self.val_set)
        opening.update(1)
        self.batches = None  # map-style data: step s draws a pure function of (seed, s)
        if isinstance(train_set, IterableDataset):
            self.feed = StreamFeed(train_set, spec.train.global_batch_size, spec.data.loader, device,
                                   spec.train.seed, self.dp_rank, self.dp, spec.train.micro_batch_size)
        else:
            self.batches = GlobalBatches(train_set, spec.train.global_batch_size, spec.train.seed,
                                         self.recovery.data_skips if self.recovery else None)
            self.feed = MapFeed(self.batches, spec.data.loader, device, self.dp_rank, self.dp,
                                spec.train.micro_batch_size)

        building = self.reporter.phase(Phase.BUILDING_MODEL, total=3)
        model = build_model(spec)
        building.update(1)
        self.model_params = sum(p.numel() for p in model.parameters())  # whole, before any sharding: for MFU
        if spec.train.init_from:
            checkpointing.load_weights(init_source(spec.train.init_from, self.storage), model)
        self.strategy = build_strategy(spec)
        # nodes: the placement's node map (parallel.collectives 'hierarchical' builds its groups from it)
        self.ctx = StrategyContext(spec, rank, world_size, self.mesh, device, self.comm,  # type: ignore[arg-type]
                                   self.control_groups, tuple(nodes), joining=joining)
        self.model = self.strategy.wrap(model, self.ctx)
        self.loss_fn = with_aux_loss(LOSSES[spec.train.loss], self.model)  # + the MoE load-balancing loss
        self.expert_load = expert_load(self.model, spec.dims.coordinates(rank)["tp"])  # MoE: tokens per expert
        building.update(2)
        self.optimizer = self.strategy.build_optimizer(self.model, self.ctx)
        building.update(3)
        # Integrity where no replica exists: this rank's own state, sealed after each update and verified
        # before it is read again (workers/training/shard_integrity.py).
        self.held = HeldStateCheck(self.model, self.optimizer, rank, world_size, self.control_groups,
                                   enabled=bool(spec.fault_tolerance.integrity_check_every))
        # CPU's peak tracker is a TorchDispatchMode, under which compiled blocks run eager: a compiled job on
        # CPU measures no per-step peak (CUDA's allocator counts it either way)
        untracked = 0 if spec.train.compile and device.type != "cuda" else None
        self.memory = StepMemory(self.model, self.optimizer, device, every=untracked, first=untracked)  # peak bytes
        self.checkpointer = checkpointing.Checkpointer(self.storage, spec.checkpoint.keep, rank)
        self.checkpointer.progress = (self.recovery or RecoveryState()).progress()
        # Ranks that train alone (the parameter server's async trainers) save checkpoints by themselves.
        self.checkpointer.solo = self.strategy.hooks.trains_alone

    def join_running(self) -> int:
        """A joining rank's start: the step the strategy joined at (no checkpoint is loaded: the running
        shards hold the model). The step it starts from."""
        self.step = self.strategy.hooks.join_step()
        return self.step

    # --- the loop --------------------------------------------------------

    def run(self, emit: Callable[[RankEvent], None], control: RankControl) -> dict:
        """Train to the last step, then finish (final checkpoint, validation, export). Out of memory
        anywhere in it is raised as OutOfMemory, with the figures: the job fails without a restart."""
        self.reporter.attach(emit)
        try:
            return self._train(emit, control)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            last = self.reporter.last
            where = last.describe() if last is not None and last.phase != Phase.TRAINING else f"step {self.step + 1}"
            raise out_of_memory(exc, self.rank, where, self.device, _predicted_peak(self.spec)) from exc

    def _train(self, emit: Callable[[RankEvent], None], control: RankControl) -> dict:
        spec = self.spec
        every = spec.checkpoint.every_steps
        self.checkpointer.notify = lambda event: emit(RankNotice(self.rank, event))  # store retries, from its thread
        for notice in self.notices:
            emit(RankNotice(self.rank, notice))
        # Ranks that never meet after their set-up (the parameter server's async trainers): no collective in
        # the loop, so a lost peer blocks none. One of them (the lead) validates and saves, alone.
        alone = self.strategy.hooks.trains_alone
        while self.step < spec.train.steps:
            try:
                record = self.train_step().to_dict()
                record.update(self.strategy.hooks.step_report())  # parameter server: staleness, rows moved
                if record["skipped"]:
                    record["skip_reason"] = self.skip_reason
            except (NonFiniteTraining, SilentDataCorruption):
                # Every replica raises at the same step: let the save in flight (a good state)
                # become durable, so the rollback loses as little as possible.
                self.checkpointer.wait()
                raise
            self.reporter.note(Progress(Phase.TRAINING, self.step, spec.train.steps))
            due = bool(every) and self.step % every == 0 and self.step < spec.train.steps
            evaluated = bool(spec.train.eval_every) and self.step % spec.train.eval_every == 0
            writer = alone and (due or evaluated) and self.strategy.hooks.writes_for_all(self.rank)
            if evaluated and (writer or not alone):
                validation = self.evaluate(alone=alone)
                record["val_loss"], record["validation"] = validation.loss, validation.as_record()
            checkpointed = due and (writer or not alone)
            if checkpointed:
                self._report_durable(emit, self._wait_for_save())  # at most one save in flight
                self._save()
            if alone:  # a stop request is this rank's own: at a checkpoint step, as agreed ones are
                stop, shares = due and control.stop_event.is_set(), None
            else:
                stop, shares = (control.agree(self.control_groups, may_stop=checkpointed)
                                if agreement_due(spec, self.step, checkpointed, self.uneven) else (False, None))
            emit(RankStep(record))
            if shares is not None:  # a live re-split of the data: the next step splits the global batch anew
                self.shares = shares
                emit(RankShares(self.rank, self.step, tuple(shares)))
            if stop:  # preempted: stop after this checkpoint, which finish() makes durable
                break
            self._report_durable(emit, self.checkpointer.completed())
        return self.finish(emit)


def _predicted_peak(spec: JobSpec) -> int | None:
    """The planner's predicted peak per worker, for an out-of-memory error's figures (None: not predicted)."""
    try:
        from workers.parallel.memory_fit import predicted_peak

        return predicted_peak(spec)
    except Exception:  # a figure for an error message: never a second error
        return None
