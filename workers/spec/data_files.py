"""Where data files are and what can be known of them before a job runs.

Patterns are expanded with fsspec (local paths need no object store). At submit time only
local files are looked at, by metadata alone: patterns that match nothing, `tokens` shards
whose size is not a whole number of tokens or that hold fewer than seq_len + 1 tokens.
Remote files are checked when the job opens them (a job error naming the file).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from workers.spec.data import FileDataSpec
from workers.spec.errors import Violation


def is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def filesystem(uri: str) -> tuple[Any, str]:
    """(fsspec filesystem, path within it) of a path or URI."""
    import fsspec

    return fsspec.core.url_to_fs(uri)


def expand(patterns: list[str]) -> list[str]:
    """Every file the patterns match, each pattern's matches sorted, in pattern order, without repeats.
    A local result stays a plain path; a remote one keeps its protocol."""
    out: list[str] = []
    for pattern in patterns:
        fs, path = filesystem(pattern)
        matches = sorted(fs.glob(path)) if any(c in path for c in "*?[") else ([path] if fs.isfile(path) else [])
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        for m in matches:
            if fs.isdir(m):
                continue
            full = m if is_local(pattern) else f"{protocol}://{m}"
            if full not in out:
                out.append(full)
    return out


def file_violations(d: FileDataSpec) -> Iterator[Violation]:
    f = d.files
    for key, patterns in (("paths", f.paths), ("validation", f.validation or [])):
        for i, pattern in enumerate(patterns):
            if not is_local(pattern):
                continue  # known when the job opens it
            matched = expand([pattern])
            if not matched:
                yield Violation(f"data.files.{key}",
                    f"data.files.{key}[{i}] matches no file ({pattern!r})")
            if f.format in ("tokens", "text"):
                yield from _shard_sizes(f"data.files.{key}", matched, f.dtype if f.format == "tokens" else "uint8",
                                        f.seq_len)
    if d.tokenizer is not None and f.format == "tokens":
        yield Violation("data.tokenizer", "data.tokenizer applies to jsonl, parquet and text files; "
                                          "'tokens' files already hold token ids (give data.tokenizer: null)")
    if d.tokenizer is not None and not os.path.isdir(os.path.join(d.tokenizer)):
        yield Violation("data.tokenizer",
            f"data.tokenizer must be a local Hugging Face tokenizer directory ({d.tokenizer!r} is none)")


def _shard_sizes(field: str, files: list[str], dtype: str, seq_len: int) -> Iterator[Violation]:
    itemsize = np.dtype(dtype).itemsize
    for path in files:
        size = os.path.getsize(path.removeprefix("file://"))
        if size % itemsize:
            yield Violation(field, f"{field}: {path} is {size} bytes, not a whole number of {dtype} tokens")
        elif size // itemsize < seq_len + 1:
            yield Violation(field, f"{field}: {path} holds {size // itemsize} tokens, fewer than "
                                   f"data.files.seq_len + 1 = {seq_len + 1}")
