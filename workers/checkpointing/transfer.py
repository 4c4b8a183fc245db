"""Bytes of a checkpoint written so far, so that a rank waiting on a slow save reports progress rather than
looking hung (workers/training/progress.py), and the injected slow or stalled write that tests it.

DCP's FileSystemWriter writes each file through `fs.create_stream`; `MeteredFileSystem` hands it a stream
that counts what passes (and, under an injected `Throttle`, writes it slowly or stops halfway). The total
is what the rank's save plan holds (`expect`, from the plan's tensor sizes), so a rank whose tensors another
rank writes (DCP writes a replicated tensor once) expects only its own.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from torch.distributed.checkpoint.filesystem import FileSystem


@dataclass(frozen=True)
class Throttle:
    """An injected slow store (workers/training/faults.py): the rank's bytes take `seconds` to write, in
    `chunks` even steps; `stall`: the write stops halfway and never progresses again."""

    seconds: float
    stall: bool = False
    chunks: int = 20


class TransferMeter:
    """Bytes written of the bytes expected, read from the thread that waits on the save."""

    def __init__(self, throttle: Throttle | None = None):
        self._lock = threading.Lock()
        self.done, self.total = 0, 0
        self.throttle = throttle

    def expect(self, nbytes: int) -> None:
        with self._lock:
            self.total += nbytes

    def add(self, nbytes: int) -> None:
        with self._lock:
            self.done += nbytes

    def snapshot(self) -> tuple[int, int]:
        """(bytes written, bytes expected): the file format's own bytes (torch.save's records) come on top
        of the tensors planned, so the expectation grows to what is written."""
        with self._lock:
            return self.done, max(self.total, self.done)


class _MeteredStream(io.RawIOBase):
    def __init__(self, raw, meter: TransferMeter):
        self.raw, self.meter = raw, meter

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:
        view = memoryview(b).cast("B")
        throttle = self.meter.throttle
        if throttle is None:
            n = self.raw.write(view)
            self.meter.add(len(view))
            return n if n is not None else len(view)
        # The delay is spread over the planned bytes: the format's extra bytes after them go at disk speed.
        total = self.meter.total or len(view)
        chunk = max(1, total // throttle.chunks)
        for start in range(0, len(view), chunk):
            part = view[start:start + chunk]
            if throttle.stall and self.meter.done >= total // 2:
                while True:  # an upload that stopped: only the supervisor's hang timer ends it
                    time.sleep(3600)
            self.raw.write(part)
            if self.meter.done < total:
                time.sleep(throttle.seconds * min(len(part), total - self.meter.done) / total)
            self.meter.add(len(part))
        return len(view)

    def tell(self) -> int:
        return self.raw.tell()

    def flush(self) -> None:
        if not self.raw.closed:
            self.raw.flush()

    def fileno(self) -> int:
        return self.raw.fileno()

    def close(self) -> None:
        super().close()  # flushes first
        self.raw.close()


class MeteredFileSystem(FileSystem):
    """DCP's local file system, every write counted on `meter`."""

    def __init__(self, meter: TransferMeter):
        super().__init__()
        self.meter = meter

    @contextmanager
    def create_stream(self, path, mode: str) -> Iterator[io.IOBase]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with Path(path).open(mode) as raw:
            stream = _MeteredStream(raw, self.meter)
            yield stream  # type: ignore[misc]


def planned_bytes(plan) -> int:
    """The tensor bytes of a rank's DCP save plan (its own share: replicated tensors are planned on one rank)."""
    total = 0
    for item in plan.items:
        data = item.tensor_data
        if data is None:  # a pickled non-tensor: small
            continue
        n = 1
        for s in data.size:
            n *= s
        total += n * data.properties.dtype.itemsize
    return total
