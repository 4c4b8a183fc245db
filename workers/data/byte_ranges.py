"""Reading a range of a file without loading it: np.memmap for local files, ranged reads through fsspec
for any other URI. Opened lazily, once per process (loader workers each open their own)."""

from __future__ import annotations

from typing import Any

import numpy as np

from workers.data.errors import DataError, DataReadError
from workers.spec.data_files import filesystem, is_local


class TokenFile:
    """A flat array of `dtype` tokens in one file."""

    def __init__(self, path: str, dtype: str, size_bytes: int):
        self.path, self.dtype = path, np.dtype(dtype)
        self.n_tokens = size_bytes // self.dtype.itemsize
        self._array: np.ndarray | None = None
        self._remote: Any = None

    def read(self, start: int, count: int) -> np.ndarray:
        """Tokens [start, start + count), as a fresh array (never a view that keeps the map alive)."""
        if start < 0 or start + count > self.n_tokens:
            raise DataError(self.path, start * self.dtype.itemsize,
                            f"tokens [{start}, {start + count}) lie beyond the file's {self.n_tokens} tokens")
        try:
            if is_local(self.path):
                if self._array is None:
                    self._array = np.memmap(self.path.removeprefix("file://"), dtype=self.dtype, mode="r",
                                            shape=(self.n_tokens,))
                out = np.array(self._array[start : start + count])
            else:
                if self._remote is None:
                    fs, path = filesystem(self.path)
                    self._remote = fs.open(path, "rb")
                self._remote.seek(start * self.dtype.itemsize)
                out = np.frombuffer(self._remote.read(count * self.dtype.itemsize), dtype=self.dtype).copy()
        except DataError:
            raise
        except (OSError, ValueError) as exc:
            raise DataReadError(self.path, start * self.dtype.itemsize, f"unreadable ({type(exc).__name__}: {exc})")
        if len(out) != count:
            raise DataReadError(self.path, start * self.dtype.itemsize, f"short read: {len(out)} of {count} tokens")
        return out

    def __getstate__(self) -> dict:  # loader workers reopen the file themselves
        return {**self.__dict__, "_array": None, "_remote": None}


def file_size(path: str) -> int:
    try:
        fs, p = filesystem(path)
        return int(fs.size(p))
    except (OSError, ValueError) as exc:
        raise DataReadError(path, 0, f"unreadable ({type(exc).__name__}: {exc})")
