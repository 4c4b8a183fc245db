"""File datasets and streams trained on the session's real Ray: loss falls, restarts are exact, bad data fails."""

from __future__ import annotations

import numpy as np
import pytest

from tests.fixtures.data_files import jsonl_file, parquet_file, token_shards
from tests.helpers import spec_of
from tests.workers.test_runtime import Recorder, assert_nothing_left, run_job

pytestmark = pytest.mark.slow

LOADER = {"num_workers": 2, "prefetch_factor": 4, "pin_memory": "auto"}


def test_token_shards_with_loader_workers_restart_bit_identical_and_match_4_ranks(ray_cluster, tmp_path):
    files = {"paths": [token_shards(tmp_path / "d", 4, 3000)], "seq_len": 32,
             "validation": [token_shards(tmp_path / "d", 1, 2000, prefix="val")]}
    base = {"data": {"files": files, "loader": LOADER}, "resources.workers": 2, "checkpoint.every_steps": 4,
            "train.steps": 12}
    two = Recorder()
    clean = run_job(spec_of(**base), tmp_path, "clean", two)
    assert clean["state"] == "SUCCEEDED" and clean["final_loss"] < clean["initial_loss"] - 0.4
    assert clean["final_val_loss"] < clean["initial_loss"]
    four = Recorder()  # 4 ranks train the same global batches (a resize 4 -> 2 keeps them)
    assert run_job(spec_of(**{**base, "resources.workers": 4}), tmp_path, "four", four)["state"] == "SUCCEEDED"
    for a, b in zip(two.steps, four.steps, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5), a["step"]
    faulty = run_job(spec_of(**base, fault_injection=[{"at_step": 10, "rank": 1, "kind": "crash"}]),
                     tmp_path, "faulty")
    assert faulty["state"] == "SUCCEEDED" and faulty["restarts"] == 1
    assert faulty["params_sha256"] == clean["params_sha256"]
    assert faulty["final_val_loss"] == clean["final_val_loss"]
    assert_nothing_left()


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_record_files_train_to_lower_loss(ray_cluster, tmp_path, fmt):
    path = (jsonl_file(tmp_path / "r.jsonl", 400) if fmt == "jsonl"
            else parquet_file(tmp_path / "r.parquet", 400, row_group_size=64))
    spec = spec_of(data={"files": {"paths": [path], "format": fmt, "seq_len": 32},
                         "loader": {"num_workers": 1}}, **{"train.steps": 12})
    summary = run_job(spec, tmp_path, fmt)
    assert summary["state"] == "SUCCEEDED" and summary["final_loss"] < summary["initial_loss"] - 0.5


@pytest.mark.exhaustive  # make test: token shards with loader workers restart bit-identical (the test above)
def test_a_stream_resumes_from_its_saved_position(ray_cluster, tmp_path):
    base = {"model": {"name": "mlp", "in_features": 4}, "train.loss": "mse",
            "data": {"entrypoint": "tests.fixtures.data_files:counting_stream", "args": {"n": 200},
                     "loader": {"num_workers": 2}},
            "checkpoint.every_steps": 4, "train.steps": 14}  # the stream ends and starts again in step 13
    clean = run_job(spec_of(**base), tmp_path, "clean")
    assert clean["state"] == "SUCCEEDED" and clean["final_loss"] < clean["initial_loss"]
    faulty = run_job(spec_of(**base, fault_injection=[{"at_step": 11, "rank": 0, "kind": "crash"}]),
                     tmp_path, "faulty")
    assert faulty["restarts"] == 1 and faulty["params_sha256"] == clean["params_sha256"]


def test_a_token_beyond_the_vocabulary_fails_the_job_naming_file_and_offset(ray_cluster, tmp_path):
    pattern = token_shards(tmp_path, 1, 600)
    raw = np.fromfile(tmp_path / "train-000.bin", dtype=np.uint16)
    raw[100] = 4000  # in window 3 (tokens 96..128)
    raw.tofile(tmp_path / "train-000.bin")
    spec = spec_of(data={"files": {"paths": [pattern], "seq_len": 32}, "loader": {"num_workers": 1}},
                   **{"resources.workers": 2, "train.steps": 30})
    summary = run_job(spec, tmp_path)
    assert summary["state"] == "FAILED" and summary["restarts"] == 0
    assert "train-000.bin at offset 200: token id 4000" in summary["error"]
    assert_nothing_left()
