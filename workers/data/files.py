"""`data.files`: the training and validation splits of sharded files, each a lazy map-style dataset."""

from __future__ import annotations

from torch.utils.data import Dataset

from workers.data.errors import DataError
from workers.data.record_files import LineFile, ParquetFile, RecordFiles
from workers.data.token_files import TokenShards
from workers.spec.data import FileDataSpec
from workers.spec.data_files import expand


def file_splits(d: FileDataSpec, vocab_size: int | None) -> tuple[Dataset, Dataset]:
    train = _dataset(d, _matched(d.files.paths, "paths"), vocab_size)
    if not d.files.validation:
        return train, train
    return train, _dataset(d, _matched(d.files.validation, "validation"), vocab_size)


def _matched(patterns: list[str], key: str) -> list[str]:
    files: list[str] = []
    for pattern in patterns:  # remote patterns are first expanded here, in the job
        matched = expand([pattern])
        if not matched:
            raise DataError(pattern, 0, f"data.files.{key}: the pattern matches no file")
        files += [m for m in matched if m not in files]
    return files


def _dataset(d: FileDataSpec, paths: list[str], vocab_size: int | None) -> Dataset:
    f = d.files
    if f.format == "tokens" or (f.format == "text" and d.tokenizer is None):
        return TokenShards(paths, f.dtype if f.format == "tokens" else "uint8", f.seq_len, vocab_size)
    if f.format == "parquet":
        records: list = [ParquetFile(p, f.field) for p in paths]
    else:  # jsonl, or text tokenised a line at a time
        records = [LineFile(p, f.field, parse=f.format == "jsonl") for p in paths]
    empty = [r.path for r in records if len(r) == 0]
    if empty:
        raise DataError(empty[0], 0, "the file holds no records")
    return RecordFiles(records, f.seq_len, d.tokenizer, vocab_size)
