"""A job's log as the control plane reads it: its last lines, then what is appended (to follow it).

On local storage a log is one file in the job directory; on an object store it is chunks that the
rank or supervisor shipped (workers/storage/log_chunks.py). Both read their tail from the end only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from service.log_tail import tail_file, tail_lines
from workers.storage import Storage
from workers.storage.log_chunks import ChunkedLogFile, LogCursor
from workers.storage.log_output import LOG_DIR, chunked_log

READ_BYTES = 1 << 20  # a follower is sent at most this much per read


class JobLog(Protocol):
    def tail(self, lines: int) -> str:
        """The last `lines` lines; later `read_more` calls continue after them."""
        ...

    def read_more(self) -> bytes:
        """What was written since the last call (b"" when nothing)."""
        ...


class FileLog:
    def __init__(self, path: Path):
        self.path, self.offset = path, 0

    def tail(self, lines: int) -> str:
        text, self.offset = tail_file(self.path, lines)
        return text

    def read_more(self) -> bytes:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                data = f.read(READ_BYTES)
        except FileNotFoundError:
            return b""
        self.offset += len(data)
        return data


class ShippedLog:
    def __init__(self, job: Storage, file_name: str):
        self.job, self.name = job, chunked_log(file_name)
        self.cursor: LogCursor | None = None

    def tail(self, lines: int) -> str:
        f = ChunkedLogFile(self.job, self.name)
        text = tail_lines(f, lines, f.size).decode(errors="replace")
        self.cursor = LogCursor(self.job, self.name, f.size, f.starts)
        return text

    def read_more(self) -> bytes:
        if self.cursor is None:
            self.cursor = LogCursor(self.job, self.name)
        return self.cursor.read(READ_BYTES)


def job_log(job: Storage, file_name: str) -> JobLog:
    """`file_name` is `rank-<n>.log` or `supervisor.log`."""
    return FileLog(job.local_path / LOG_DIR / file_name) if job.is_local else ShippedLog(job, file_name)
