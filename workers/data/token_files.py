"""`tokens` and byte-level `text` shards as a map-style dataset of next-token windows.

Sample i is window w of some shard: tokens [w * seq_len, w * seq_len + seq_len + 1), split into
(input, target). Only file sizes are read up front; each window is read when it is asked for,
from a memory map (local) or a ranged read (fsspec), so memory does not grow with the data.
"""

from __future__ import annotations

import bisect

import numpy as np
import torch
from torch.utils.data import Dataset

from workers.data.byte_ranges import TokenFile, file_size
from workers.data.errors import DataError


class TokenShards(Dataset):
    def __init__(self, paths: list[str], dtype: str, seq_len: int, vocab_size: int | None):
        self.seq_len, self.vocab_size = seq_len, vocab_size
        self.files: list[TokenFile] = []
        self.starts: list[int] = []  # first sample index of each file
        total = 0
        for path in paths:
            f = TokenFile(path, dtype, file_size(path))
            windows = (f.n_tokens - 1) // seq_len
            if windows < 1:
                raise DataError(path, 0, f"the shard holds {f.n_tokens} tokens, fewer than seq_len + 1 = "
                                         f"{seq_len + 1}")
            self.files.append(f)
            self.starts.append(total)
            total += windows
        self.n = total

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        k = bisect.bisect_right(self.starts, i) - 1
        f, start = self.files[k], (i - self.starts[k]) * self.seq_len
        window = f.read(start, self.seq_len + 1)
        self._check_vocabulary(f, start, window)
        tokens = torch.from_numpy(window.astype(np.int64))
        return tokens[:-1], tokens[1:]

    def _check_vocabulary(self, f: TokenFile, start: int, window: np.ndarray) -> None:
        if self.vocab_size is None:
            return
        bad = np.flatnonzero((window >= self.vocab_size) | (window < 0))
        if len(bad):
            at = start + int(bad[0])
            raise DataError(f.path, at * f.dtype.itemsize, f"token id {int(window[bad[0]])} (token {at}) is "
                                                           f"outside the model's vocabulary of {self.vocab_size}")
