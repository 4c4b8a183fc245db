"""Checkpointer: one rank's asynchronous DCP saves to the job's storage.

A checkpoint holds model, optimiser and progress: the step, and what rollbacks changed (data windows
skipped, the learning-rate factor; see workers/training/recovery.py). The data position and the
learning rate are pure functions of those, and RNG is reseeded from (seed, step, rank) every step,
so that is all the progress there is.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

from workers.checkpointing.layout import JobStorage, checkpoint_root, prune, step_name
from workers.checkpointing.retry import RetryPolicy, StoreUnavailable
from workers.checkpointing.save_plans import SavePlans
from workers.checkpointing.staging import StagedUpload
from workers.checkpointing.transfer import Throttle, TransferMeter
from workers.checkpointing.writer import MeteredFileSystemWriter, metered, writer_for
from workers.events import RunEvent
from workers.phases import Phase
from workers.runtime.gloo_groups import lazy_gloo_group
from workers.storage import Storage

log = logging.getLogger("trainyard.checkpoint")

# Optimiser state keyed per parameter name, hyper-parameters included ("param_groups.<fqn>.lr"):
# a rank that holds other parameters after a resharding (pipeline stages moving, pp <-> dp)
# finds each parameter's state and group settings by its own name.
OPTIM_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


class Checkpointer:
    """Saves asynchronously on a dedicated gloo group so training collectives never interleave."""

    def __init__(self, job: JobStorage, keep: int, rank: int, policy: RetryPolicy | None = None):
        self.storage, self.keep, self.rank = Storage.of(job), keep, rank
        self.policy = policy or RetryPolicy.from_env()
        self.group = lazy_gloo_group()  # the save's thread: not the control group (workers/runtime/gloo_groups.py)
        self._pending: Future | None = None
        self._pending_step = 0
        self._started = 0.0
        self.last_duration_s: float | None = None  # save start to durable, of the last completed save
        self.progress: dict = {}  # recorded beside the step (the trainer's data skips and LR factor)
        self.notify: Callable[[RunEvent], None] = lambda event: log.warning(event.message)  # the trainer's emit
        self.meter = self.upload_meter = TransferMeter()  # the bytes of the save in flight (transfer.py)
        self.uploads = StagedUpload(self.storage, rank, self.group, self.policy, lambda event: self.notify(event))
        self.plans = SavePlans()  # the layout is fixed for this Checkpointer's life (save_plans.py)
        # A rank that saves the whole checkpoint by itself, no collective (the parameter server's async
        # trainers: their lead saves while the others train, or are lost).
        self.solo = False

    def save(self, model: nn.Module, optimizer: torch.optim.Optimizer, step: int,
             throttle: Throttle | None = None) -> None:
        """Start saving `step`; `throttle`: an injected slow or stalled write (workers/training/faults.py)."""
        self.wait()  # at most one save in flight (callers that report durability wait first)
        self._started = time.monotonic()
        # Bytes to the job's storage (a local directory), or to the node's staging directory first.
        self.meter = TransferMeter(throttle)
        model_sd, optim_sd = get_state_dict(model, optimizer, options=OPTIM_OPTIONS)
        state = {"model": model_sd, "optim": optim_sd, "progress": {**self.progress, "step": step}}
        name, notify = step_name(step), lambda event: self.notify(event)
        target = checkpoint_root(self.storage) / name
        if self.storage.is_local:
            writer = metered(writer_for(target, f"checkpoint {name}", self.rank, self.policy, notify), self.meter)
        else:  # written to this node's disk, then uploaded in the background (staging.py says why)
            writer = metered(MeteredFileSystemWriter(str(self.uploads.staging_dir(name))), self.meter)
        if self.solo:
            from torch.distributed.checkpoint import DefaultSavePlanner

            pending = dcp.async_save(state, storage_writer=writer, planner=DefaultSavePlanner(), no_dist=True)
        else:
            pending = dcp.async_save(state, storage_writer=writer, process_group=self.group,
                                     planner=self.plans.planner())
        assert isinstance(pending, Future)  # an AsyncSaveResponse comes only with async staging (not asked for)
        self.upload_meter = TransferMeter()
        self._pending = (pending if self.storage.is_local
                         else self.uploads.after(pending, target, name, self.upload_meter))
        self._pending_step = step

    def completed(self) -> int | None:
        """The step of the in-flight save if it has just become durable (non-blocking)."""
        if self._pending is not None and self._pending.done():
            return self.wait()
        return None

    def transfer(self) -> tuple[Phase, int, int]:
        """Where the save in flight is: (phase, bytes done, bytes expected). To a local directory the
        write is the upload; to an object store, staged on the node's disk, then uploaded."""
        if self.storage.is_local:
            return (Phase.UPLOADING_CHECKPOINT, *self.meter.snapshot())
        if self.upload_meter.total:
            return (Phase.UPLOADING_CHECKPOINT, *self.upload_meter.snapshot())
        return (Phase.SAVING_CHECKPOINT, *self.meter.snapshot())

    def wait(self, progress: Callable[[int, Phase, int, int], None] | None = None,
             every_s: float = 0.5) -> int | None:
        """Block until the in-flight save is durable; returns its step. StoreUnavailable when a rank's
        writes gave up on the store (DCP raises the same gathered error on every rank). While it waits,
        `progress(step, phase, bytes done, bytes expected)` every `every_s`."""
        if self._pending is None:
            return None
        pending, self._pending = self._pending, None
        try:
            while progress is not None and not pending.done():
                progress(self._pending_step, *self.transfer())
                try:
                    pending.result(timeout=every_s)
                except FutureTimeout:
                    continue
            pending.result()
        except StoreUnavailable:
            raise
        except CheckpointException as exc:
            gave_up = [e for e in _failures(exc) if isinstance(e, StoreUnavailable)]
            if gave_up:
                raise StoreUnavailable(str(gave_up[0])) from exc
            raise
        self.last_duration_s = time.monotonic() - self._started
        if self.rank == 0 or self.solo:
            self._prune()
        return self._pending_step

    def _prune(self) -> None:
        try:
            prune(self.storage, self.keep)
        except Exception as exc:  # the next save prunes again; an old checkpoint kept is no harm
            log.warning("pruning checkpoints failed: %s", exc)


def _failures(exc: CheckpointException) -> list[BaseException]:
    """The per-rank errors inside DCP's gathered exception ((exception, traceback) pairs)."""
    out = []
    for failure in exc.failures.values():
        inner = failure[0] if isinstance(failure, tuple) else failure
        out += [inner] if isinstance(inner, BaseException) else []
    return out
