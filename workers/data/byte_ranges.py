"""Reading a range of a file without loading it: np.memmap for local files, ranged reads through fsspec
for any other URI. Opened lazily, once per process (loader workers each open their own).

A mapped page stays in the process's resident set until the map is closed, and the kernel may map a
whole page-cache folio (hundreds of KB) for a 4 KB window: a long run over a large shard would grow
the resident set with everything it ever read (reclaimable, but counted). So the map is reopened
every REMAP_EVERY reads, which bounds what one file keeps mapped.
"""

from __future__ import annotations

import mmap
from typing import Any

import numpy as np

from workers.data.errors import DataError, DataReadError
from workers.spec.data_files import filesystem, is_local

REMAP_EVERY = 16


class TokenFile:
    """A flat array of `dtype` tokens in one file."""

    def __init__(self, path: str, dtype: str, size_bytes: int):
        self.path, self.dtype = path, np.dtype(dtype)
        self.n_tokens = size_bytes // self.dtype.itemsize
        self._array: np.ndarray | None = None
        self._remote: Any = None
        self._reads = 0

    def read(self, start: int, count: int) -> np.ndarray:
        """Tokens [start, start + count), as a fresh array (never a view that keeps the map alive)."""
        if start < 0 or start + count > self.n_tokens:
            raise DataError(self.path, start * self.dtype.itemsize,
                            f"tokens [{start}, {start + count}) lie beyond the file's {self.n_tokens} tokens")
        try:
            if is_local(self.path):
                if self._array is None or self._reads % REMAP_EVERY == 0:
                    self._array = _random_access_map(self.path.removeprefix("file://"), self.dtype, self.n_tokens)
                self._reads += 1
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


def _random_access_map(path: str, dtype: np.dtype, n_tokens: int) -> np.memmap:
    """A read-only memory map told that reads are random (samples are drawn from a permutation), so that
    the kernel need not read ahead around each window."""
    array = np.memmap(path, dtype=dtype, mode="r", shape=(n_tokens,))
    raw = getattr(array, "_mmap", None)
    if raw is not None and hasattr(mmap, "MADV_RANDOM"):
        raw.madvise(mmap.MADV_RANDOM)
    return array


def file_size(path: str) -> int:
    try:
        fs, p = filesystem(path)
        return int(fs.size(p))
    except (OSError, ValueError) as exc:
        raise DataReadError(path, 0, f"unreadable ({type(exc).__name__}: {exc})")
