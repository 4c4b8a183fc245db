"""The training loop of one rank. Reads top to bottom: build, resume, step, checkpoint, export.

Determinism: the model is built from `train.seed`; the global batch of step s is
a pure function of (seed, s); the learning rate is a pure function of s; RNG is
reseeded from (seed, s, rank) every step; DDP reduces buckets in a fixed order.
So a run resumed from a checkpoint at the same world size ends bit-identical to
the uninterrupted run, which `params_sha256` proves.
"""

from __future__ import annotations

import math
import os
import time
from typing import Callable

import torch
import torch.distributed as dist
from torch.utils.data import IterableDataset

from workers import checkpointing
from workers.checkpointing.retry import with_retries
from workers.data import build_datasets
from workers.data.batches import GlobalBatches
from workers.data.loader import MapFeed
from workers.data.stream import StreamFeed
from workers.events import (
    CheckpointIncompleteEvent,
    RankCheckpoint,
    RankEvent,
    RankNotice,
    RankShares,
    RankStep,
    RestartCause,
    RunEvent,
)
from workers.model_io import UserModelError, logits_of
from workers.models import build_model, hf_source
from workers.models.hf import save_pretrained
from workers.models.moe_loss import with_aux_loss
from workers.models.moe_telemetry import expert_load
from workers.parallel import StrategyContext, build_strategy
from workers.parallel.control_group import ControlGroups
from workers.parallel.mesh import build_mesh
from workers.parallel.parallelize import sequence_shard
from workers.peak_flops import peak_flops
from workers.phases import Phase, Progress
from workers.spec import HFModelSpec, JobSpec
from workers.step_memory import StepMemory
from workers.storage import Storage
from workers.telemetry import CommMeter, StepRecord, model_state_bytes
from workers.training.control import RankControl, UnevenShares, agreement_due
from workers.training.faults import FaultInjector
from workers.training.final_phases import FinalPhases
from workers.training.integrity import SilentDataCorruption, check_replicas
from workers.training.loss_scaling import LossScaler
from workers.training.losses import LOSSES
from workers.training.lr_schedule import lr_at
from workers.training.out_of_memory import is_out_of_memory, out_of_memory
from workers.training.progress import CountedList, ProgressReporter, report_interval_s
from workers.training.recovery import LossSpikeDetector, RecoveryState
from workers.training.shard_integrity import HeldStateCheck
from workers.training.step_clock import clock_for
from workers.training.validation import Validation, eval_batches_of, rank_batch_count, validate


class Trainer:
    def __init__(self, spec: JobSpec, rank: int, world_size: int, device: torch.device,
                 job: Storage | str | os.PathLike, uneven: UnevenShares | None = None,
                 reporter: ProgressReporter | None = None, nodes: tuple[str, ...] = ()):
        self.spec, self.rank, self.world_size, self.device = spec, rank, world_size, device
        # Progress outside the steps (set-up, validation, checkpoint bytes, export): the supervisor's hang
        # timer runs on it (workers/training/progress.py); held until run() has somewhere to send it.
        self.reporter = reporter or ProgressReporter(rank, report_interval_s(spec.fault_tolerance.hang_timeout_s))
        self.resumed_step = 0  # the checkpoint this attempt resumed from
        self.storage = Storage.of(job)  # the job's directory: a local one or on an object store
        self.notices: list[RunEvent] = []  # what this rank saw before run() could emit it
        self.dims = spec.dims
        self.mesh = build_mesh(self.dims, device.type)
        self.control_groups = ControlGroups()  # host-side collectives: gloo, on GPU too
        # Ranks that share a dp index see the same data (tensor/pipeline peers).
        self.dp, self.dp_rank = self.dims.dp, self.dims.coordinates(rank)["dp"]
        if self.dims.size("dp_cp") > 1:  # every rank together: the validation loss is summed on the CPU
            self.control_groups.mirror(self.dims, "dp_cp")
        self.accum = spec.grad_accum_steps
        self.clock = clock_for(device)  # host time on CPU, CUDA events on GPU
        self.peak = peak_flops(device, half=spec.parallel.mixed_precision != "fp32")  # for MFU
        self.comm = CommMeter(self.clock if device.type == "cuda" else None)
        self.loss_fn = LOSSES[spec.train.loss]
        self.faults = FaultInjector(spec.fault_injection, rank, self.storage)
        self.step = 0  # optimizer steps completed
        self.skipped_in_a_row = 0
        self.skip_reason: str | None = None  # why the last step's update was skipped
        # Rollbacks so far: data windows never to draw again and the LR factor (workers/training/recovery.py).
        self.recovery = RecoveryState.load(self.storage)
        self.spikes = LossSpikeDetector(spec.fault_tolerance.loss_spike)
        self.scaler = LossScaler(enabled=spec.parallel.mixed_precision == "fp16")
        self.uneven = uneven  # granted by the supervisor: the data split may change at agreement steps
        self.shares = list(uneven.start) if uneven is not None and uneven.start else None  # None = even
        self.model_state_bytes: int | None = None
        self.steps_trained = 0  # by this process (a restarted rank starts again at 0)

        opening = self.reporter.phase(Phase.OPENING_DATA, total=1)
        train_set, self.val_set = build_datasets(spec)
        self.eval_batches = eval_batches_of(spec, train_set, self.val_set)
        opening.update(1)
        self.batches: GlobalBatches | None = None  # map-style data: step s draws a pure function of (seed, s)
        self.feed: MapFeed | StreamFeed
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
        self.ctx = StrategyContext(spec, rank, world_size, self.mesh, device, self.comm, self.control_groups,
                                   tuple(nodes))
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

    # --- resume ----------------------------------------------------------

    def resume_from_latest(self) -> int:
        skipped: list[tuple[int, list[str]]] = []
        latest = checkpointing.latest_checkpoint(self.storage, lambda step, missing: skipped.append((step, missing)))
        if self.rank == 0:  # every rank skips the same ones: one report
            self.notices += [CheckpointIncompleteEvent(step, tuple(missing), latest[0] if latest else 0)
                             for step, missing in skipped]
        if latest is not None:
            loading = self.reporter.phase(Phase.LOADING_CHECKPOINT, total=1, step=latest[0], what=f"step {latest[0]}")
            progress = checkpointing.load_state(latest[1], self.model, self.optimizer)
            if hasattr(self.strategy, "after_load"):  # parameter server: the shards' state saved with it
                self.strategy.after_load(self.storage, latest[0], self.rank, self.control_groups)
            loading.update(1)
            self.resumed_step = latest[0]
            self.held.seal()  # the state a check verified before it was saved
            self.step = int(progress["step"])
            self.scaler.load_state_dict(progress)
            if self.recovery is None:  # no ledger in this job directory: what the checkpoint recorded
                self.recovery = RecoveryState.from_progress(progress)
                for a, b in self.recovery.data_skips:
                    if self.batches is not None:
                        self.batches.skip_window(a, b)
                self.checkpointer.progress = self.recovery.progress()
            if isinstance(self.feed, StreamFeed):  # the loader state the checkpoint saved
                self.feed.load_state_dict({"samples": int(progress.get("stream_samples")
                                                          or self.step * self.spec.train.global_batch_size)})
        return self.step

    # --- one step --------------------------------------------------------

    def train_step(self) -> StepRecord:
        spec, s = self.spec, self.step
        self.held.verify(f"between step {s}'s update and step {s + 1}'s forward")  # before it is read again
        self.faults.before_step(s + 1)
        torch.manual_seed(spec.train.seed * 1_000_003 + s * 4099 + self.rank)
        self.model.train()
        self.comm.reset()
        t0, cpu0, start = time.perf_counter(), _cpu_clock(), self.clock.mark()
        with self.memory.measuring(s + 1) as memory:  # the peak is taken inside the step
            micro = self.feed.micro_batches(s, self.shares)
            self.faults.exhaust_memory(s + 1, self.device)
            if not self.steps_trained:  # its set-up happens inside the strategy, micro-batch by micro-batch
                micro = CountedList(micro, self.reporter.phase(Phase.FIRST_STEP, total=len(micro), step=s))
            loss_fn = self._step_loss(len(micro))
            if self.faults.fires(s + 1, "nan"):  # poison before backward so every replica sees it
                loss_fn = _poisoned(loss_fn)
            if (spike := self.faults.spike_factor(s + 1)) > 1.0:
                loss_fn = _scaled(loss_fn, spike)
            if self.scaler.enabled:
                loss_fn = _scaled(loss_fn, self.scaler.scale)
            fb = self._forward_backward(micro, loss_fn)
            if fb.loss is not None:
                fb.loss /= self.scaler.factor  # a power of two: exact
            self.scaler.unscale_(self.model)
            backward_done, backward_mark = time.perf_counter(), self.clock.mark()
            # Time blocked after the last gradient was ready is exposed communication.
            comm_time = max(0.0, backward_done - self.comm.last_launch) if self.comm.last_launch else 0.0
            launch_mark = self.comm.last_launch_mark  # GPU: read after the step's synchronisation below
            if fb.comm_time_s is not None:  # the strategy timed its own communication (pipeline p2p + all-reduce)
                comm_time = fb.comm_time_s

            grad_norm = self._clip_gradients()
            lr = lr_at(spec.train, s) * (self.recovery.lr_scale if self.recovery else 1.0)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            # Gradients are synchronised, so every rank sees the same norm and takes the same decision.
            non_finite = grad_norm is not None and not math.isfinite(grad_norm)
            if self.scaler.overflowed(grads_finite=not non_finite):
                self.skip_reason = "fp16_overflow"  # skipped with the scale halved: no fault, not counted
            else:
                self.skip_reason = "non_finite" if non_finite else "loss_spike" if self._loss_spiked(fb.loss) else None
            skipped = self.skip_reason is not None
            if self.skip_reason in ("non_finite", "loss_spike"):
                self.skipped_in_a_row += 1
                if self.skipped_in_a_row > spec.fault_tolerance.max_skipped_steps:
                    raise self._roll_back(s + 1)
            elif not skipped:
                self.skipped_in_a_row = 0
                self.spikes.observe(fb.loss)
                with memory.updating():
                    self.optimizer.step()
                self.held.seal()  # what the update wrote (ZeRO: after its all-gather)
        if self.scaler.enabled:  # checkpoints carry the scale, so a resumed run continues identically
            self.checkpointer.progress.update(self.scaler.state_dict())
        self._inject_slowness(s + 1, time.perf_counter() - t0 - comm_time, _cpu_clock() - cpu0)
        if self.model_state_bytes is None:  # measured once, while grads and optimiser state exist
            self.model_state_bytes = model_state_bytes(self.model, self.optimizer)["total"]
        self.optimizer.zero_grad(set_to_none=True)
        end = self.clock.mark()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            if launch_mark is not None and fb.comm_time_s is None:
                comm_time = max(0.0, self.clock.seconds(launch_mark, backward_mark))
        step_time = self.clock.seconds(start, end) if self.device.type == "cuda" else time.perf_counter() - t0

        self.step = s + 1
        self.faults.flip_a_bit(self.step, self.model, self.optimizer)  # at rest: after the seal
        self._check_replicas_agree()
        record = StepRecord(
            step=self.step, rank=self.rank, loss=fb.loss, step_time_s=step_time,
            compute_time_s=self._compute_time(step_time - comm_time, _cpu_clock() - cpu0),
            comm_time_s=comm_time,
            samples=fb.samples, tokens=fb.tokens, grad_norm=grad_norm, lr=lr,
            comm_bytes=self.comm.logical_bytes, model_state_bytes=self.model_state_bytes, stage=fb.stage,
            cross_node_bytes=self.comm.cross_node_bytes if self.comm.counts_nodes else None,
            skipped=skipped, peak_memory_bytes=memory.peak.peak_bytes if memory.peak else None,
            peak_memory_breakdown=memory.peak.breakdown if memory.peak else None,
            peak_activation_bytes=memory.peak.category_peaks["activations"] if memory.peak else None,
            peak_flops_per_s=self.peak.flops_per_s, model_params=self.model_params,
            memory_tracked=memory.tracker is not None,
            expert_tokens=self.expert_load.take() if self.expert_load is not None else None,
        )
        return record

    def _forward_backward(self, micro: list, loss_fn):
        """The strategy's forward/backward. A failure of this rank's first step that is not a peer's
        (communication) error is the model's or the data's: typed, so that when every rank fails the
        same way the supervisor fails the job at once instead of restarting it (workers/runtime/group.py)."""
        if self.steps_trained:
            return self.strategy.forward_backward(self.model, micro, loss_fn, self.ctx)
        try:
            fb = self.strategy.forward_backward(self.model, micro, loss_fn, self.ctx)
        except UserModelError:
            raise
        except dist.DistError:
            raise
        except Exception as exc:
            if is_out_of_memory(exc):  # not the model's fault: the memory's (typed in run())
                raise
            shapes = _shapes(micro[0]) if micro else "no micro-batch"
            raise UserModelError(f"the first training step failed in the model or the loss "
                                 f"({type(exc).__name__}: {exc}); batch {shapes}") from exc
        self.steps_trained += 1
        return fb

    def _loss_spiked(self, loss: float | None) -> bool:
        """Whether any rank's loss spiked (a collective when `fault_tolerance.loss_spike` is set):
        every rank must skip the same updates, as with non-finite gradients."""
        if self.spec.fault_tolerance.loss_spike is None:
            return False
        flag = torch.tensor([1.0 if self.spikes.is_spike(loss) else 0.0])
        return bool(self.control_groups.all_reduce(flag, op=dist.ReduceOp.MAX).item())

    def _roll_back(self, step: int) -> "NonFiniteTraining":
        """Too many bad steps in a row: record what the rollback changes (rank 0 writes the ledger,
        every rank raises at the same step) and return the error that asks the supervisor for it."""
        ft, bad = self.spec.fault_tolerance, self.skipped_in_a_row
        first = step - bad + 1  # 1-based steps first..step went bad; step k draws batch_of(k - 1)
        batch_of = self.batches.batch_of if self.batches is not None else (lambda k: k)  # a stream has no skips
        window = [batch_of(first - 1), batch_of(step - 1) + 1]
        state = self.recovery or RecoveryState()
        if ft.skip_data_on_rollback:
            state.data_skips = [list(w) for w in sorted({tuple(w) for w in state.data_skips} | {tuple(window)})]
        state.lr_scale *= ft.lr_backoff or 1.0
        state.rollbacks.append({"at_step": step, "bad_steps": [first, step], "reason": self.skip_reason,
                                "data_window": window if ft.skip_data_on_rollback else None,
                                "lr_scale": state.lr_scale})
        if self.rank == 0:
            state.save(self.storage)
        what = "non-finite" if self.skip_reason == "non_finite" else "loss-spike"
        return NonFiniteTraining(f"{bad} bad steps in a row ({what} at step {step}): "
                                 f"rolling back to the last checkpoint")

    def _check_replicas_agree(self, force: bool = False) -> None:
        """What the strategy keeps replicated must be identical on its replicas: compare digests every
        N steps (the spec rules put every periodic checkpoint on such a step; `force`: the final one)."""
        every = self.spec.fault_tolerance.integrity_check_every
        if not every or (self.step % every and not force):
            return
        check_replicas(self.strategy.replica_groups(self.model, self.ctx), self.step, self.control_groups)
        self.held.verify(f"after step {self.step}'s update")  # before a checkpoint saves it

    def _step_loss(self, n_micro: int):
        """The loss as strategies see it: with uneven shares, weight each micro-batch by its size.

        Strategies divide by the number of micro-batches and DDP averages over dp ranks, so a
        micro-batch of m samples must count m x dp / G (x n_micro to undo the division): the
        gradient stays that of the global-batch mean and the reported per-rank losses still
        average to the global loss.
        """
        if self.shares is None:
            return self.loss_fn
        scale = self.dp * n_micro / self.spec.train.global_batch_size
        return lambda outputs, targets: self.loss_fn(outputs, targets) * (logits_of(outputs).shape[0] * scale)

    def _compute_time(self, wall_busy: float, cpu: float) -> float:
        """Time this rank spent computing, not waiting. On CPU that is CPU time (_cpu_clock):
        unlike wall time it does not grow when other processes take the cores (a busy host is
        not a slow rank). On GPU, wall time outside communication."""
        return wall_busy if self.device.type == "cuda" else min(cpu, wall_busy) if wall_busy > 0 else cpu

    def _clip_gradients(self) -> float | None:
        max_norm = self.spec.train.grad_clip if self.spec.train.grad_clip is not None else math.inf
        return self.strategy.clip_grad_norm(self.model, max_norm)

    def _inject_slowness(self, step: int, wall_compute: float, cpu_compute: float) -> None:
        factor = self.faults.slow_factor(step)
        if factor > 1.0 and self.device.type == "cuda":
            _busy_wait((factor - 1.0) * wall_compute)
        elif factor > 1.0:
            # A slower CPU: factor x the CPU work. Measured in CPU time, not wall time, which a busy
            # host inflates (a wall-time slowdown fed back on itself once both ranks competed for cores).
            _burn_cpu((factor - 1.0) * cpu_compute)

    def evaluate(self, what: str = "validation") -> Validation:
        """The validation loss and what it covered, reporting its batches as they go (a long validation
        is progress, not a hang)."""
        # An SDP rank holds a subnetwork: its strategy assembles the whole model to evaluate (collective).
        model = self.strategy.evaluation_model(self.model) if hasattr(self.strategy, "evaluation_model") else self.model
        # The reported loss is a host value: summed over dp (x cp) through the CPU mirror of those groups.
        group = self.control_groups.mirror(self.dims, "dp_cp") if self.dims.size("dp_cp") > 1 else None
        meter = self.reporter.phase(Phase.EVALUATING, rank_batch_count(self.val_set, self.spec, self.dp,
                                                                       self.eval_batches), self.step, what)
        progress = meter.update
        if what == "final validation" and self.faults.faults:  # an injected crash may strike halfway through
            def progress(done: int, total: int | None = None) -> None:
                meter.update(done, total)
                self.faults.in_final_validation(self.step, done, meter.progress.total or 0)
        return validate(model, self.val_set, self.spec, self.dp_rank, self.dp, self.device, self.eval_batches,
                        group, progress=progress, shard=sequence_shard(self.dims, self.rank))

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
        while self.step < spec.train.steps:
            try:
                record = self.train_step().to_dict()
                if hasattr(self.strategy, "step_report"):  # parameter server: staleness, rows moved
                    record.update(self.strategy.step_report())
                if record["skipped"]:
                    record["skip_reason"] = self.skip_reason
            except (NonFiniteTraining, SilentDataCorruption):
                # Every replica raises at the same step: let the save in flight (a good state)
                # become durable, so the rollback loses as little as possible.
                self.checkpointer.wait()
                raise
            self.reporter.note(Progress(Phase.TRAINING, self.step, spec.train.steps))
            if spec.train.eval_every and self.step % spec.train.eval_every == 0:
                validation = self.evaluate()
                record["val_loss"], record["validation"] = validation.loss, validation.as_record()
            checkpointed = bool(every) and self.step % every == 0 and self.step < spec.train.steps
            if checkpointed:
                self._report_durable(emit, self._wait_for_save())  # at most one save in flight
                self._save()
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

    def _save(self) -> None:
        if isinstance(self.feed, StreamFeed):  # a stream's position is its loader state, not the step
            self.checkpointer.progress["stream_samples"] = self.feed.state_dict()["samples"]
        if hasattr(self.strategy, "before_save"):  # parameter server: the shards' state beside the model's
            self.strategy.before_save(self.model, self.storage, self.step, self.rank, self.control_groups)
        # An injected slow or stalled write (fault kinds slow_upload, stall_upload) is the store's, not the loop's.
        self.checkpointer.save(self.model, self.optimizer, self.step, throttle=self.faults.upload_throttle(self.step))

    def _wait_for_save(self) -> int | None:
        """The in-flight save made durable; its bytes reported while it is not (a slow store is progress)."""
        def progress(step: int, phase: Phase, done: int, total: int) -> None:
            self.reporter.report(Progress(phase, done, total or None, step, f"step {step}"))

        return self.checkpointer.wait(progress, every_s=self.reporter.interval_s)

    def _report_durable(self, emit: Callable[[RankEvent], None], step: int | None) -> None:
        if step is not None:
            emit(RankCheckpoint(self.rank, step, self.checkpointer.last_duration_s))

    def finish(self, emit: Callable[[RankEvent], None]) -> dict:
        """After the last step: the final checkpoint, the final validation, the export, each reporting its
        progress. A restart after the last step resumes into the phases left (final_phases.py)."""
        self._report_durable(emit, self._wait_for_save())
        if self.step < self.spec.train.steps:
            return {"stopped_at": self.step}
        self.feed.close()
        self._check_replicas_agree(force=True)  # the final checkpoint is verified too, whatever its step
        if self.resumed_step != self.step:  # resumed from the final checkpoint: it is there already
            self._save()
            self._wait_for_save()
        emit(RankCheckpoint(self.rank, self.step, self.checkpointer.last_duration_s))
        done = FinalPhases.load(self.storage, self.step)
        self.control_groups.barrier()  # every rank has read what is done before rank 0 may record more
        writer = self.rank == 0
        if self.model_state_bytes is not None and done.get("model_state_bytes") is None:
            done.record("model_state_bytes", self.model_state_bytes, writer)
        validation = done.get("validation")
        if validation is None:
            validation = self.evaluate("final validation").as_record()
            done.record("validation", validation, writer)
        result: dict[str, object] = {"step": self.step, "model_state_bytes": done.get("model_state_bytes"),
                                     "val_loss": validation["loss"], "validation": validation}
        if hasattr(self.strategy, "report"):  # SDP: masks, spectral gap, held fractions
            result["sdp"] = self.strategy.report()
        exported = done.get("export")
        if exported is None:
            exported = self._export()
            self.control_groups.barrier()  # every rank past the gather: rank 0's record says it is done
            done.record("export", exported, writer)
        result.update(exported if writer else {})
        self.control_groups.barrier()
        return result

    def _export(self) -> dict[str, object]:
        """The whole model gathered (a collective), hashed and written by rank 0 (its paths and hash)."""
        exporting = self.reporter.phase(Phase.EXPORTING, total=3, step=self.step, what="final model")
        # A pipeline rank holds only its stages: its strategy gathers the whole model.
        state = getattr(self.strategy, "full_model_state", checkpointing.full_model_state)(self.model)
        exporting.update(1)
        if self.rank != 0:
            return {}
        out: dict[str, object] = {"params_sha256": checkpointing.state_sha256(state)}
        exporting.update(2)
        meta = {"job": self.spec.name, "step": self.step, "spec": self.spec.model_dump(mode="json")}
        out["export_path"] = self._with_store_retries(
            "model export", lambda: checkpointing.export_model(self.storage, state, meta))
        if isinstance(self.spec.model, HFModelSpec):  # also as transformers loads it: hf/ beside it
            source = hf_source(self.spec.model)
            out["hf_export_path"] = self._with_store_retries("hf export", lambda: checkpointing.export_hf(
                self.storage, lambda path: save_pretrained(*source, state, path)))
        exporting.update(3)
        return out

    def _with_store_retries(self, what: str, write: Callable[[], str]) -> str:
        return with_retries(write, what, self.rank, self.checkpointer.policy, self.checkpointer.notify)


class NonFiniteTraining(RuntimeError):
    """Too many non-finite steps in a row: the supervisor rolls back to the last checkpoint."""

    restart_cause = RestartCause.NON_FINITE


def _predicted_peak(spec: JobSpec) -> int | None:
    """The planner's predicted peak per worker, for an out-of-memory error's figures (None: not predicted)."""
    try:
        from workers.parallel.memory_fit import predicted_peak

        return predicted_peak(spec)
    except Exception:  # a figure for an error message: never a second error
        return None


def init_source(init_from: str, job: Storage) -> Storage:
    """`train.init_from` as a location: a URI or an absolute path as given; a relative path from the
    storage root (the directory above `jobs/`), as the control plane's admission reads it."""
    if "://" in init_from or os.path.isabs(init_from):
        return Storage.at(init_from)
    return job.parent.parent / init_from


def _shapes(batch) -> str:
    inputs, targets = batch
    described = ({k: tuple(v.shape) for k, v in inputs.items()} if isinstance(inputs, dict)
                 else tuple(inputs.shape))
    return f"inputs {described}, targets {None if targets is None else tuple(targets.shape)}"


def _poisoned(loss_fn):
    return lambda outputs, targets: loss_fn(outputs, targets) * float("nan")


def _scaled(loss_fn, factor: float):
    return lambda outputs, targets: loss_fn(outputs, targets) * factor


def _cpu_clock() -> float:
    """CPU seconds of the computing thread: the training thread alone when torch computes on one
    thread (Ray's RPC threads, gloo's communication and async checkpoint threads are not compute,
    and on a busy host their share made clean ranks look slow); the whole process otherwise."""
    return time.thread_time() if torch.get_num_threads() == 1 else time.process_time()


def _burn_cpu(seconds: float) -> None:
    end = _cpu_clock() + seconds
    while _cpu_clock() < end:
        pass


def _busy_wait(seconds: float) -> None:
    # Burn CPU rather than sleep: a degraded node computes slowly, it does not idle.
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass

