"""A data error names the file and the offset. Bad content (a token beyond the vocabulary, a short
shard, a broken record) is the same after any restart: the job fails at once, whichever rank read it.
A file that could not be read may be a passing storage fault: that one is restarted (within budget)."""

from __future__ import annotations

from workers.model_io import UserModelError


class DataError(UserModelError):
    retryable = False  # workers/runtime/group.py fails the job without restarting it
    def __init__(self, path: str, offset: int | str | None = None, problem: str = ""):
        if offset is None:  # one message: how a DataLoader worker's error is raised again in the rank
            super().__init__(_original(path))
        else:
            super().__init__(f"data: {path} at offset {offset}: {problem}")


def _original(message: str) -> str:
    """The error's own message, without the worker's traceback torch wraps it in (every rank then
    reports the same text, and the supervisor sees one data error instead of a retryable failure)."""
    marker = f"{DataError.__name__}: "
    lines = [line for line in message.splitlines() if marker in line]
    return lines[-1].split(marker, 1)[1] if message.startswith("Caught") and lines else message


class DataReadError(DataError):
    retryable = True
