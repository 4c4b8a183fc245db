"""The data section's submit-time rules, and validation over the whole split summed over ranks."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from tests.fixtures.data_files import token_shards
from tests.helpers import spec_of
from workers.data import build_datasets
from workers.models import build_model
from workers.spec import SpecError, format_validation_error
from workers.training.validation import validation_loss, validation_sums


def refused(files: dict, **extra) -> list[dict]:
    with pytest.raises((SpecError, ValidationError)) as caught:
        spec_of(data={"files": {"seq_len": 16, **files}, **extra})
    return format_validation_error(caught.value)


def test_patterns_formats_dtypes_and_short_shards_are_refused_at_submit(tmp_path):
    [p] = refused({"paths": [str(tmp_path / "none-*.bin")]})
    assert p["field"] == "data.files.paths" and "matches no file" in p["message"]
    [p] = refused({"paths": [token_shards(tmp_path, 1, 100)], "validation": [str(tmp_path / "val-*.bin")]})
    assert p["field"] == "data.files.validation"
    (tmp_path / "short.bin").write_bytes(b"\0" * 20)
    [p] = refused({"paths": [str(tmp_path / "short.bin")]})
    assert "short.bin holds 10 tokens, fewer than data.files.seq_len + 1 = 17" in p["message"]
    (tmp_path / "odd.bin").write_bytes(b"\0" * 41)
    [p] = refused({"paths": [str(tmp_path / "odd.bin")]})
    assert "not a whole number of uint16 tokens" in p["message"]
    [p] = refused({"paths": [str(tmp_path / "short.bin")], "format": "csv"})
    assert p["field"] == "data.files.format"
    [p] = refused({"paths": [str(tmp_path / "short.bin")], "dtype": "float32"})
    assert p["field"] == "data.files.dtype"
    [p] = refused({"paths": [token_shards(tmp_path, 1, 100)]}, tokenizer=str(tmp_path))
    assert p["field"] == "data.tokenizer" and "already hold token ids" in p["message"]
    [p] = refused({"paths": [token_shards(tmp_path, 1, 100)]}, loader={"num_workers": -1})
    assert p["field"] == "data.loader.num_workers"


def test_remote_uris_wait_for_the_job_and_loader_is_accepted_everywhere():
    spec = spec_of(data={"files": {"paths": ["s3://bucket/tokens/train-*.bin"], "seq_len": 16}})
    assert spec.data.files.paths == ["s3://bucket/tokens/train-*.bin"] and spec.data.loader.num_workers == 0
    text = spec_of(data={"name": "text:pystdlib", "max_bytes": 100_000, "loader": {"num_workers": 2}})
    assert text.data.loader.num_workers == 2 and text.data.loader.pin_memory == "auto"
    user = spec_of(model={"name": "mlp", "in_features": 4},
                   data={"entrypoint": "tests.fixtures.data_files:counting_stream",
                         "loader": {"num_workers": 1, "prefetch_factor": 4, "pin_memory": False}},
                   **{"train.loss": "mse"})
    assert user.data.loader.prefetch_factor == 4


def test_validation_covers_the_whole_split_and_sums_over_ranks(tmp_path):
    spec = spec_of(data={"files": {"paths": [token_shards(tmp_path, 1, 1700)],
                                   "validation": [token_shards(tmp_path, 1, 900, prefix="val")], "seq_len": 16}})
    _, val = build_datasets(spec)
    assert len(val) == 56  # 7 rounds of 2 x 4 at dp 2; at dp 3, 4 rounds of 3 x 4 and a short one of 8
    torch.manual_seed(0)
    model = build_model(spec)
    whole, n = validation_sums(model, val, spec, 0, 1)
    assert n == 56
    for dp in (2, 3):
        parts = [validation_sums(model, val, spec, r, dp) for r in range(dp)]
        assert sum(c for _, c in parts) == 56
        assert sum(t for t, _ in parts) == pytest.approx(whole, rel=1e-5)
    capped = validation_sums(model, val, spec, 0, 1, max_batches=2)[1]
    assert capped == 32 and validation_loss(model, val, spec, 0, 1) == pytest.approx(whole / 56)
