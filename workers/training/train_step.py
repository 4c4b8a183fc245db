"""One optimizer step of a rank: its micro-batches forward and backward through the strategy, the gradients
clipped, the update taken or skipped (non-finite, fp16 overflow, a loss spike), too many bad steps in a
row turned into a rollback, and what the step measured as its StepRecord.

Determinism: RNG is reseeded from (seed, s, rank) every step and the learning rate is a pure function of
s (trainer.py says why a resumed run ends bit-identical)."""

from __future__ import annotations

import math
import time

import torch
import torch.distributed as dist

from workers.model_io import UserModelError, logits_of
from workers.phases import Phase
from workers.telemetry import StepRecord, model_state_bytes
from workers.training.cpu_time import burn_cpu, busy_wait, cpu_clock
from workers.training.integrity import check_replicas
from workers.training.lr_schedule import lr_at
from workers.training.out_of_memory import is_out_of_memory
from workers.training.progress import CountedList
from workers.training.rank_state import RankState
from workers.training.recovery import NonFiniteTraining, RecoveryState


class StepTraining(RankState):
    def train_step(self) -> StepRecord:
        spec, s = self.spec, self.step
        self.held.verify(f"between step {s}'s update and step {s + 1}'s forward")  # before it is read again
        self.faults.before_step(s + 1)
        torch.manual_seed(spec.train.seed * 1_000_003 + s * 4099 + self.rank)
        self.model.train()
        self.comm.reset()
        t0, cpu0, start = time.perf_counter(), cpu_clock(), self.clock.mark()
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
        self._inject_slowness(s + 1, time.perf_counter() - t0 - comm_time, cpu_clock() - cpu0)
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
            compute_time_s=self._compute_time(step_time - comm_time, cpu_clock() - cpu0),
            comm_time_s=comm_time,
            samples=fb.samples, tokens=fb.tokens, grad_norm=grad_norm, lr=lr,
            comm_bytes=self.comm.logical_bytes, comm_bytes_uncompressed=self.comm.uncompressed_bytes or None,
            model_state_bytes=self.model_state_bytes, stage=fb.stage,
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
        """Time this rank spent computing, not waiting. On CPU that is CPU time (cpu_time.py):
        unlike wall time it does not grow when other processes take the cores (a busy host is
        not a slow rank). On GPU, wall time outside communication."""
        return wall_busy if self.device.type == "cuda" else min(cpu, wall_busy) if wall_busy > 0 else cpu

    def _clip_gradients(self) -> float | None:
        max_norm = self.spec.train.grad_clip if self.spec.train.grad_clip is not None else math.inf
        return self.strategy.clip_grad_norm(self.model, max_norm)

    def _inject_slowness(self, step: int, wall_compute: float, cpu_compute: float) -> None:
        factor = self.faults.slow_factor(step)
        if factor > 1.0 and self.device.type == "cuda":
            busy_wait((factor - 1.0) * wall_compute)
        elif factor > 1.0:
            # A slower CPU: factor x the CPU work. Measured in CPU time, not wall time, which a busy
            # host inflates (a wall-time slowdown fed back on itself once both ranks competed for cores).
            burn_cpu((factor - 1.0) * cpu_compute)


def _shapes(batch) -> str:
    inputs, targets = batch
    described = ({k: tuple(v.shape) for k, v in inputs.items()} if isinstance(inputs, dict)
                 else tuple(inputs.shape))
    return f"inputs {described}, targets {None if targets is None else tuple(targets.shape)}"


def _poisoned(loss_fn):
    return lambda outputs, targets: loss_fn(outputs, targets) * float("nan")


def _scaled(loss_fn, factor: float):
    return lambda outputs, targets: loss_fn(outputs, targets) * factor
