"""DCP's writer and reader for a job's storage: the plain filesystem ones on a local disk, the fsspec
ones (checkpoint_id an s3:// or gs:// URL) straight on an object store, each store call retried on
failure (retry.py).

On an object store the Checkpointer stages locally and uploads (staging.py, measured faster); the
fsspec writer here stays for bench/checkpoint_store.py's comparison and for single-process saves.
Retries are per rank and per write: DCP's collective steps (planning, the metadata's
gathering) never touch the store, so ranks do not have to agree on when to retry; a rank that gives
up fails the save on every rank through DCP's own error gathering.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable

from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter, StorageReader, StorageWriter
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from workers.checkpointing.retry import RetryPolicy, with_retries
from workers.checkpointing.transfer import MeteredFileSystem, TransferMeter, planned_bytes
from workers.events import RunEvent
from workers.storage import Storage

Notify = Callable[[RunEvent], None]


class _Retrying:
    """Mixed into a DCP writer: every store call of a rank's part of a save is retried (making the
    directory, writing its shards; on the coordinator, the metadata)."""

    what: str
    rank_id: int
    policy: RetryPolicy
    notify: Notify

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:  # it makes the directory: a store call
        return with_retries(lambda: super(_Retrying, self).prepare_local_plan(plan),  # type: ignore[misc]
                            f"{self.what} (rank {self.rank_id}'s directory)", self.rank_id, self.policy, self.notify)

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        # Rewriting the same plan writes the same file names: a retry replaces a partial upload.
        results = with_retries(lambda: super(_Retrying, self).write_data(plan, planner).wait(),  # type: ignore[misc]
                               f"{self.what} (rank {self.rank_id}'s shards)", self.rank_id, self.policy, self.notify)
        done: Future[list[WriteResult]] = Future()
        done.set_result(results)
        return done

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        with_retries(lambda: super(_Retrying, self).finish(metadata, results),  # type: ignore[misc]
                     f"{self.what} (metadata)", self.rank_id, self.policy, self.notify)


class _Metered:
    """Mixed into a DCP writer in front of the retries: the rank's planned bytes, counted once, on `meter`
    (its writes are counted by the MeteredFileSystem that `metered` installs)."""

    meter: TransferMeter | None = None

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        if self.meter is not None:
            self.meter.expect(planned_bytes(plan))
        return super().write_data(plan, planner)  # type: ignore[misc]


def metered(writer: StorageWriter, meter: TransferMeter | None) -> StorageWriter:
    """A local-disk writer whose bytes show on `meter` (None: as it is)."""
    if meter is not None and isinstance(writer, _Metered):
        writer.meter, writer.fs = meter, MeteredFileSystem(meter)  # type: ignore[attr-defined]
    return writer


class MeteredFileSystemWriter(_Metered, FileSystemWriter):
    """DCP's plain local writer (an object store's staging directory), its bytes counted."""


class RetryingFileSystemWriter(_Metered, _Retrying, FileSystemWriter):
    pass


class RetryingFsspecWriter(_Retrying, FsspecWriter):
    """On an object store, fewer round trips: no directory to make, and `.metadata` in one PUT (atomic
    on a store: readers never see half of it) instead of DCP's write-temporary, check, rename (copy +
    delete on S3)."""

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        metadata.version = CURRENT_DCP_VERSION
        metadata.storage_data = {wr.index: wr.storage_data for wr_list in results for wr in wr_list}
        metadata.storage_meta = self.storage_meta()
        data, path = pickle.dumps(metadata), str(self._get_metadata_path())
        with_retries(lambda: self.fs.fs.pipe_file(path, data),  # type: ignore[attr-defined]  # fsspec wrapper
                     f"{self.what} (metadata)", self.rank_id, self.policy, self.notify)


def writer_for(checkpoint: Storage, what: str, rank: int, policy: RetryPolicy, notify: Notify) -> StorageWriter:
    writer: RetryingFileSystemWriter | RetryingFsspecWriter
    if checkpoint.is_local:
        writer = RetryingFileSystemWriter(str(checkpoint.local_path))
    else:
        # Objects are durable once written (no fsync: DCP would fall back to syncing the whole node's disks);
        # listings uncached, as in Storage (another rank's or supervisor's objects must show).
        writer = RetryingFsspecWriter(checkpoint.uri, sync_files=False, use_listings_cache=False)
    writer.what, writer.rank_id, writer.policy, writer.notify = what, rank, policy, notify
    if not checkpoint.is_local:  # the store's client as Storage made it, under this process's store variables
        writer.fs.fs = checkpoint.fs  # type: ignore[attr-defined]  # fsspec wrapper
    return writer


def reader_for(checkpoint: Storage) -> StorageReader:
    if checkpoint.is_local:
        return FileSystemReader(str(checkpoint.local_path))
    reader = FsspecReader(checkpoint.uri)
    reader.fs.fs = checkpoint.fs  # type: ignore[attr-defined]
    return reader
