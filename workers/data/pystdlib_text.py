"""Byte-level text corpus built from the Python standard library's own sources.

No download: the files ship with the interpreter. The file list is sorted and
capped, so the corpus is the same on every machine with the same Python.
"""

from __future__ import annotations

import sysconfig
from functools import lru_cache
from pathlib import Path

import torch
from torch.utils.data import Dataset


@lru_cache(maxsize=4)
def load_corpus(max_bytes: int) -> torch.Tensor:
    root = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(root.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    blob = b"".join(chunks)[:max_bytes]
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8).long()


class TokenWindows(Dataset):
    """Non-overlapping (input, next-token target) windows of a token stream."""

    def __init__(self, tokens: torch.Tensor, seq_len: int):
        self.tokens, self.seq_len = tokens, seq_len
        self.n = (len(tokens) - 1) // seq_len

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = i * self.seq_len
        window = self.tokens[start : start + self.seq_len + 1]
        return window[:-1], window[1:]


def pystdlib_splits(max_bytes: int, val_fraction: float, seq_len: int) -> tuple[TokenWindows, TokenWindows]:
    tokens = load_corpus(max_bytes)
    cut = int(len(tokens) * (1.0 - val_fraction))
    return TokenWindows(tokens[:cut], seq_len), TokenWindows(tokens[cut:], seq_len)
