"""A log on an object store: numbered chunk objects, read as one growing byte stream.

Object stores cannot append, so a log `logs/rank-0` is a directory of chunks, each named by the offset
of its first byte in the whole log (`logs/rank-0/0000000000000000`, `.../0000000001048576`, ...):

- every chunk but the last is sealed: its content never changes again;
- the last (open) chunk is rewritten by its one writer (workers/storage/log_shipping.py) with a longer
  copy of itself every few seconds, so a reader sees it grow and never sees it change;
- chunk i holds the bytes [start_i, start_i+1); the log's size is the last start plus the last chunk's size.

A reader therefore reaches any offset with one listing and one ranged read, and the last lines of a log
of any length by reading back from the end of its last chunks (`ChunkedLogFile` + service/log_tail.py),
never the whole log. One writer per log at a time: a restarted rank continues after what is there.
"""

from __future__ import annotations

import bisect
import io

from workers.storage.location import Storage

OFFSET_DIGITS = 16  # names sort by offset as text: 10^16 bytes is more than any log


def chunk_name(log: str, offset: int) -> str:
    return f"{log}/{offset:0{OFFSET_DIGITS}d}"


def chunk_starts(storage: Storage, log: str) -> list[int]:
    """The offsets the log's chunks start at, ascending; [] for a log nothing was shipped to yet."""
    return sorted(int(n) for n in storage.list(log) if n.isdigit() and len(n) == OFFSET_DIGITS)


def log_size(storage: Storage, log: str, starts: list[int] | None = None) -> int:
    starts = chunk_starts(storage, log) if starts is None else starts
    return starts[-1] + storage.size(chunk_name(log, starts[-1])) if starts else 0


class LogCursor:
    """Reads a chunked log forward from `offset` (a follower): each `read` returns what is new, b"" when
    nothing is. It lists the chunks again only when the last one it knows has no more bytes."""

    def __init__(self, storage: Storage, log: str, offset: int = 0, starts: list[int] | None = None):
        self.storage, self.log, self.offset = storage, log, offset
        self.starts = chunk_starts(storage, log) if starts is None else starts

    def read(self, limit: int = 1 << 20) -> bytes:
        data = self.read_listed(limit)
        if data:
            return data
        self.starts = chunk_starts(self.storage, self.log)  # a new chunk, sealed the one we were at
        return self.read_listed(limit)

    def read_listed(self, limit: int) -> bytes:
        """What the chunks listed so far hold from the offset on (no listing)."""
        i = bisect.bisect_right(self.starts, self.offset) - 1
        if i < 0:
            return b""
        start = self.starts[i]
        end = self.starts[i + 1] if i + 1 < len(self.starts) else None  # a sealed chunk ends where the next starts
        stop = self.offset - start + limit if end is None else min(end - start, self.offset - start + limit)
        data = self.storage.read_range(chunk_name(self.log, start), self.offset - start, stop)
        self.offset += len(data)
        return data


class ChunkedLogFile(io.RawIOBase):
    """The first `size` bytes of a chunked log as a read-only seekable file, each read a ranged read of
    the chunks it spans (what service/log_tail.tail_lines reads backwards from the end)."""

    def __init__(self, storage: Storage, log: str):
        super().__init__()
        self.storage, self.log = storage, log
        self.starts = chunk_starts(storage, log)
        self.size = log_size(storage, log, self.starts)
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        self.pos = {io.SEEK_SET: pos, io.SEEK_CUR: self.pos + pos, io.SEEK_END: self.size + pos}[whence]
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, n: int = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        cursor = LogCursor(self.storage, self.log, self.pos, self.starts)
        out = bytearray()
        while cursor.offset < end:
            piece = cursor.read_listed(end - cursor.offset)
            if not piece:
                break
            out += piece
        self.pos = cursor.offset
        return bytes(out)
