"""`jsonl`, `parquet` (and tokenised `text`) files as a map-style dataset, one sample per record.

A record's value (key/column `data.files.field`) is a string, tokenised, or a list of token ids.
A sample holds its first seq_len + 1 tokens; shorter records are padded (input 0, target -100,
which cross_entropy ignores). Indexing reads metadata only (parquet footers; jsonl line starts,
found by one streaming pass per file); records are read when asked for: a jsonl line by its byte
offset, a parquet row from its row group (the last two row groups read are kept per file).
"""

from __future__ import annotations

import bisect
import json
from collections import OrderedDict
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from workers.data.errors import DataError, DataReadError
from workers.data.tokenizers import encode
from workers.spec.data_files import filesystem

CHUNK = 1 << 20
IGNORE = -100


class LineFile:
    """Lines of a jsonl (parse=True) or text file, found by their byte offsets."""

    def __init__(self, path: str, field: str, parse: bool):
        self.path, self.field, self.parse = path, field, parse
        self.offsets = _line_starts(path)
        self._handle: Any = None

    def __len__(self) -> int:
        return len(self.offsets)

    def value(self, row: int) -> Any:
        offset = int(self.offsets[row])
        try:
            if self._handle is None:
                fs, p = filesystem(self.path)
                self._handle = fs.open(p, "rb")
            self._handle.seek(offset)
            line = self._handle.readline().decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise DataReadError(self.path, offset, f"unreadable line ({type(exc).__name__}: {exc})")
        if not self.parse:
            return line.rstrip("\n")
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(self.path, offset, f"line {row + 1} is not JSON ({exc})")
        if not isinstance(record, dict) or self.field not in record:
            raise DataError(self.path, offset, f"line {row + 1} has no key {self.field!r} (data.files.field)")
        return record[self.field]

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_handle": None}


class ParquetFile:
    """Rows of one parquet file, read a row group at a time."""

    def __init__(self, path: str, field: str):
        self.path, self.field = path, field
        meta = self._open().metadata
        if self.field not in meta.schema.names:
            raise DataError(path, 0, f"no column {field!r} (data.files.field); columns: {meta.schema.names}")
        self.row_starts = np.cumsum([0] + [meta.row_group(g).num_rows for g in range(meta.num_row_groups)])
        self._groups: OrderedDict[int, Any] = OrderedDict()

    def _open(self) -> Any:
        import pyarrow.parquet as pq

        try:
            fs, p = filesystem(self.path)
            return pq.ParquetFile(fs.open(p, "rb"))
        except Exception as exc:  # pyarrow raises its own types for a damaged file
            raise DataReadError(self.path, 0, f"unreadable parquet ({type(exc).__name__}: {exc})")

    def __len__(self) -> int:
        return int(self.row_starts[-1])

    def value(self, row: int) -> Any:
        g = int(np.searchsorted(self.row_starts, row, side="right") - 1)
        if g not in self._groups:
            try:
                self._groups[g] = self._open().read_row_group(g, columns=[self.field]).column(0)
            except DataError:
                raise
            except Exception as exc:
                raise DataReadError(self.path, f"row group {g}", f"unreadable ({type(exc).__name__}: {exc})")
            while len(self._groups) > 2:
                self._groups.popitem(last=False)
        return self._groups[g][row - int(self.row_starts[g])].as_py()

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_groups": OrderedDict()}


class RecordFiles(Dataset):
    def __init__(self, files: list[Any], seq_len: int, tokenizer: str | None, vocab_size: int | None):
        self.files, self.seq_len, self.tokenizer, self.vocab_size = files, seq_len, tokenizer, vocab_size
        self.starts = list(np.cumsum([0] + [len(f) for f in files])[:-1])
        self.n = sum(len(f) for f in files)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        k = bisect.bisect_right(self.starts, i) - 1
        f, row = self.files[k], i - int(self.starts[k])
        where = f"record {row}" if isinstance(f, ParquetFile) else int(f.offsets[row])
        try:
            ids = encode(f.value(row), self.tokenizer)[: self.seq_len + 1]
        except TypeError as exc:
            raise DataError(f.path, where, str(exc))
        if len(ids) < 2:
            raise DataError(f.path, where, f"the record has {len(ids)} token(s): a sample needs at least 2")
        if self.vocab_size is not None and (bad := [t for t in ids if not 0 <= t < self.vocab_size]):
            raise DataError(f.path, where, f"token id {bad[0]} is outside the model's vocabulary of {self.vocab_size}")
        x = torch.zeros(self.seq_len, dtype=torch.long)
        y = torch.full((self.seq_len,), IGNORE, dtype=torch.long)
        x[: len(ids) - 1] = torch.tensor(ids[:-1])
        y[: len(ids) - 1] = torch.tensor(ids[1:])
        return x, y


def _line_starts(path: str) -> np.ndarray:
    """Byte offsets of the non-empty lines, in one streaming pass (never the whole file in memory)."""
    starts: list[int] = []
    pos, line_start, blank = 0, 0, True
    try:
        fs, p = filesystem(path)
        with fs.open(p, "rb") as fh:
            while chunk := fh.read(CHUNK):
                for nl in _newlines(chunk):
                    if not _blank(chunk, line_start - pos, nl) or not blank:
                        starts.append(line_start)
                    line_start, blank = pos + nl + 1, True
                if line_start < pos + len(chunk) and chunk[max(0, line_start - pos):].strip():
                    blank = False
                pos += len(chunk)
    except OSError as exc:
        raise DataReadError(path, pos, f"unreadable ({type(exc).__name__}: {exc})")
    if line_start < pos and not blank:
        starts.append(line_start)
    return np.asarray(starts, dtype=np.int64)


def _newlines(chunk: bytes) -> list[int]:
    return np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == 10).tolist()


def _blank(chunk: bytes, start: int, end: int) -> bool:
    return not chunk[max(0, start):end].strip()
