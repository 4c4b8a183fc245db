"""A rank's checkpoints: resuming from the latest complete one, saving one (asynchronously, at most one
in flight), waiting for it to become durable while reporting its bytes, and what the strategy keeps
beside the model's state (its hooks: workers/parallel/loop_hooks.py). The checkpoint format and the store
are workers/checkpointing/'s."""

from __future__ import annotations

import os
from typing import Callable

from workers import checkpointing
from workers.checkpointing.retry import with_retries
from workers.data.stream import StreamFeed
from workers.events import CheckpointIncompleteEvent, RankCheckpoint, RankEvent
from workers.phases import Phase, Progress
from workers.storage import Storage
from workers.training.rank_state import RankState
from workers.training.recovery import RecoveryState


class Checkpoints(RankState):
    def resume_from_latest(self) -> int:
        skipped: list[tuple[int, list[str]]] = []
        latest = checkpointing.latest_checkpoint(self.storage, lambda step, missing: skipped.append((step, missing)))
        if self.rank == 0:  # every rank skips the same ones: one report
            self.notices += [CheckpointIncompleteEvent(step, tuple(missing), latest[0] if latest else 0)
                             for step, missing in skipped]
        if latest is not None:
            loading = self.reporter.phase(Phase.LOADING_CHECKPOINT, total=1, step=latest[0], what=f"step {latest[0]}")
            progress = checkpointing.load_state(latest[1], self.model, self.optimizer)
            # What the strategy saved beside the model (parameter server: its shards' state).
            self.strategy.hooks.after_load(self.storage, latest[0], self.rank, self.control_groups)
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

    def _save(self) -> None:
        if isinstance(self.feed, StreamFeed):  # a stream's position is its loader state, not the step
            self.checkpointer.progress["stream_samples"] = self.feed.state_dict()["samples"]
        # What the strategy saves beside the model's state (parameter server: its shards').
        self.strategy.hooks.before_save(self.model, self.storage, self.step, self.rank, self.control_groups)
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

    def _with_store_retries(self, what: str, write: Callable[[], str]) -> str:
        return with_retries(write, what, self.rank, self.checkpointer.policy, self.checkpointer.notify)


def init_source(init_from: str, job: Storage) -> Storage:
    """`train.init_from` as a location: a URI or an absolute path as given; a relative path from the
    storage root (the directory above `jobs/`), as the control plane's admission reads it."""
    if "://" in init_from or os.path.isabs(init_from):
        return Storage.at(init_from)
    return job.parent.parent / init_from
