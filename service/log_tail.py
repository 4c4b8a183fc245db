"""The last lines of a log, read from its end: a job's log can be gigabytes, and a request for its
last 200 lines must not read (or hold) the whole file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

BLOCK_BYTES = 64 * 1024


class ReadsAt(Protocol):
    """A file, or a log on an object store read by ranges (workers/storage/log_chunks.ChunkedLogFile)."""

    def seek(self, pos: int, whence: int = ..., /) -> int: ...

    def read(self, n: int = ..., /) -> bytes: ...


def tail_lines(f: ReadsAt, lines: int, size: int, block: int = BLOCK_BYTES) -> bytes:
    """The last `lines` lines of the first `size` bytes of `f` (a final line without a newline counts)."""
    if lines <= 0 or size <= 0:
        return b""
    buf, pos = b"", size
    # One newline more than the lines wanted (a trailing one ends the last line, it starts none).
    wanted = lines + (1 if _ends_with_newline(f, size) else 0)
    while pos > 0 and buf.count(b"\n") < wanted:
        step = min(block, pos)
        pos -= step
        f.seek(pos)
        buf = f.read(step) + buf
    return b"".join(buf.splitlines(keepends=True)[-lines:])


def _ends_with_newline(f: ReadsAt, size: int) -> bool:
    f.seek(size - 1)
    return f.read(1) == b"\n"


def tail_file(path: Path, lines: int) -> tuple[str, int]:
    """The last `lines` lines of a log and the file size they end at ("" and 0 when it does not exist)."""
    try:
        f = open(path, "rb")
    except FileNotFoundError:
        return "", 0
    with f:
        size = os.fstat(f.fileno()).st_size
        return tail_lines(f, lines, size).decode(errors="replace"), size
