"""Checkpoints on an object store through a local staging directory, uploaded in the background.

Picked by measurement over DCP's fsspec writer straight to the store (bench/checkpoint_store.py, on
the S3 test server, GPT 256x4 + AdamW, 38 MiB, one rank, median of 5, load average ~38 on 2 CPUs):

    per checkpoint | direct (fsspec) | staging + upload | staging / direct
    blocked        | 202 ms          | 108 ms           | 0.54
    durable        | 8832 ms         | 5325 ms          | 0.60
    restore        | 6647 ms         | 4442 ms          | 0.67

The fsspec writer streams every tensor through a buffered object file and its reader fetches each
tensor with its own ranged GET; staging writes one local file per rank at disk speed and moves it
in one streamed (multipart) upload. The async save already copies the state to CPU before its thread
writes, so the loop is blocked no longer either way. The restore row downloaded whole files to every
rank; a restore now fetches only the ranges of a rank's load plan, adjacent items in one GET
(store_reader.py, measured in docs/scale.md).

Protocol (a checkpoint is complete when `.metadata` and every shard it names are on the store):
DCP writes each rank's shards and rank 0's `.metadata` into the node's staging directory; each rank
uploads its own shards (retried, retry.py); the ranks then agree, on the checkpoint group, whether
every upload went through; only then rank 0 uploads `.metadata`. A node lost mid-upload leaves a
checkpoint without metadata (or short of a shard), which is never resumed from (layout.py).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch
import torch.distributed as dist

from workers.checkpointing.layout import METADATA
from workers.checkpointing.retry import RetryPolicy, StoreUnavailable, with_retries
from workers.checkpointing.transfer import TransferMeter
from workers.events import RunEvent
from workers.storage import Storage, local_dir


class StagedUpload:
    """Uploads one rank's staged checkpoints, one at a time, in its own thread."""

    def __init__(self, storage: Storage, rank: int, group, policy: RetryPolicy, notify: Callable[[RunEvent], None]):
        self.storage, self.rank, self.group, self.policy, self.notify = storage, rank, group, policy, notify
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-upload")

    def staging_dir(self, name: str) -> Path:
        return local_dir(self.storage) / "staging" / name

    def after(self, written: Future, target: Storage, name: str, meter: TransferMeter | None = None) -> Future:
        """Once DCP has `written` the checkpoint `name` locally, upload it to `target`; a future of that.
        `meter`: the bytes uploaded, file by file."""
        return self._thread.submit(self._upload, written, target, name, meter or TransferMeter())

    def _upload(self, written: Future, target: Storage, name: str, meter: TransferMeter) -> None:
        written.result()
        staged = self.staging_dir(name)
        failed: StoreUnavailable | None = None
        shards = sorted(staged.glob(f"__{self.rank}_*"))  # this rank's shards (ranks may share a node)
        meter.expect(sum(p.stat().st_size for p in shards) or 1)
        try:
            for path in shards:
                with_retries(lambda: target.upload(path, path.name), f"checkpoint {name} (rank {self.rank}'s shards)",
                             self.rank, self.policy, self.notify)
                meter.add(path.stat().st_size)
        except StoreUnavailable as exc:
            failed = exc
        # Every rank learns whether every upload went through: none waits on a rank that gave up.
        gave_up = torch.tensor([1.0 if failed else 0.0])
        dist.all_reduce(gave_up, op=dist.ReduceOp.MAX, group=self.group)
        if failed is not None:
            raise failed
        if gave_up.item():
            raise StoreUnavailable(f"checkpoint {name}: another rank's upload gave up on the storage")
        if self.rank == 0:  # last: the checkpoint is complete once this is on the store
            with_retries(lambda: target.upload(staged / METADATA, METADATA), f"checkpoint {name} (metadata)",
                         self.rank, self.policy, self.notify)
        shutil.rmtree(staged, ignore_errors=True) if self.rank == 0 else _remove_own(staged, self.rank)


def _remove_own(staged: Path, rank: int) -> None:
    for path in staged.glob(f"__{rank}_*"):
        path.unlink(missing_ok=True)
