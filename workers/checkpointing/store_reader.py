"""DCP's reader for a checkpoint on an object store: a rank fetches only the byte ranges its load plan
names, with ranged GETs, never whole shard files it does not need.

DCP gives each rank its load plan (which saved items, in which files, at which offsets, its own state
dict needs): a ZeRO/FSDP rank resumed with the same layout reads its own shards, a DDP replica the
replicated tensors (saved once, so every replica reads the same bytes), a resharded job the pieces of
each tensor it now holds. Items of one file closer than `GAP` are fetched in one GET (fewer round trips
for a few bytes more); DCP's own deserialisation then reads them from memory, one file at a time.

`bytes_read` counts what came from the store (the metadata included): the figure of docs/scale.md.
Before, every rank downloaded the whole checkpoint directory (staging.py's measurement).
"""

from __future__ import annotations

import io
import posixpath
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.filesystem import FileSystemBase
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner
from torch.futures import Future

from workers.storage import Storage

# Bytes: two needed ranges of a file closer than this are fetched as one GET. Reading 64 KiB more costs
# less than a round trip to the store; a larger gap would pull in other ranks' shards of small tensors.
GAP = 64 << 10

Range = tuple[int, int]  # [start, end) of a file


def needed_ranges(plan: LoadPlan, storage_data: dict) -> dict[str, list[Range]]:
    """File -> the merged byte ranges the plan's items lie in (sorted, gaps under GAP closed)."""
    spans: dict[str, list[Range]] = {}
    for item in plan.items:
        info = storage_data[item.storage_index]
        spans.setdefault(info.relative_path, []).append((info.offset, info.offset + info.length))
    merged: dict[str, list[Range]] = {}
    for name, ranges in spans.items():
        out: list[Range] = []
        for start, end in sorted(ranges):
            if out and start - out[-1][1] < GAP:
                out[-1] = (out[-1][0], max(out[-1][1], end))
            else:
                out.append((start, end))
        merged[name] = out
    return merged


class _FetchedRanges(io.RawIOBase):
    """A read-only file of which only some ranges were fetched; DCP seeks to an item and reads it."""

    def __init__(self, chunks: list[tuple[int, bytes]]):
        self.chunks, self.pos = chunks, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET, /) -> int:
        if whence not in (io.SEEK_SET, io.SEEK_CUR):
            raise io.UnsupportedOperation("a partly fetched file has no known end")
        self.pos = offset if whence == io.SEEK_SET else self.pos + offset
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, b: Any) -> int:
        for start, data in self.chunks:
            if start <= self.pos < start + len(data):
                n = min(len(b), start + len(data) - self.pos)
                memoryview(b)[:n] = data[self.pos - start:self.pos - start + n]
                self.pos += n
                return n
        raise OSError(f"read at byte {self.pos}: outside the ranges the load plan fetched")


class _StoreFiles(FileSystemBase):
    """The checkpoint's files as DCP's reader opens them (names relative to the checkpoint): a file of
    the plan is served from the ranges `fetch` got; any other (the metadata) is read whole."""

    def __init__(self, checkpoint: Storage):
        self.checkpoint = checkpoint
        self.wanted: dict[str, list[Range]] = {}
        self.bytes_read = 0

    @contextmanager
    def create_stream(self, path, mode: str) -> Iterator[io.IOBase]:
        if mode != "rb":
            raise io.UnsupportedOperation(f"a checkpoint on a store is read here, not written ({mode})")
        name = str(path)
        if name not in self.wanted:
            data = self.checkpoint.read_bytes(name)
            self.bytes_read += len(data)
            yield io.BytesIO(data)
            return
        chunks = self.checkpoint.read_ranges(name, self.wanted[name])
        self.bytes_read += sum(len(c) for _, c in chunks)
        yield _FetchedRanges(chunks)

    def concat_path(self, path, suffix: str) -> str:
        return posixpath.join(str(path), suffix) if str(path) else suffix

    def init_path(self, path) -> str:
        return str(path)

    def rename(self, path, new_path) -> None:
        raise io.UnsupportedOperation("read-only")

    def mkdir(self, path) -> None:
        raise io.UnsupportedOperation("read-only")

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return False  # never picked by DCP on its own: StoreReader is passed explicitly

    def exists(self, path) -> bool:
        return self.checkpoint.exists(str(path))

    def rm_file(self, path) -> None:
        raise io.UnsupportedOperation("read-only")


class StoreReader(FileSystemReader):
    """Reads a checkpoint on an object store, each rank only the ranges of its load plan."""

    def __init__(self, checkpoint: Storage):
        super().__init__("")
        self.files = _StoreFiles(checkpoint)
        self.fs = self.files  # type: ignore[assignment]  # DCP's reader opens every file through fs
        self.path = ""
        self._metadata: Metadata | None = None

    @property
    def bytes_read(self) -> int:
        return self.files.bytes_read

    def checkpoint_bytes(self) -> int:
        """The shard files' bytes, as the metadata names them (no listing call on the store)."""
        ends: dict[str, int] = {}
        for info in (self.storage_data or {}).values():
            ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
        return sum(ends.values())

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """Read once per reader (load_state reads it before DCP does)."""
        if self._metadata is None or kwargs.get("rank") is not None:
            self._metadata = super().read_metadata(*args, **kwargs)
        return self._metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        self.files.wanted = needed_ranges(plan, self.storage_data)
        return super().read_data(plan, planner)
