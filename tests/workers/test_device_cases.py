"""The device check's configurations (bench/device_cases.py) are valid specs that select the strategy they
name; `make device-check-dry` trains them (82 s, so not in `make test`)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.device_cases import NEEDS_NCCL, matrix, restart_pair
from bench.device_checkpoint import LLAMA_350M
from bench.device_throughput import measure as measure_throughput
from bench.device_throughput import trainyard_spec
from workers.parallel.layouts import strategy_name
from workers.spec_loading import parse_spec

ROOT = Path(__file__).resolve().parents[2]

EXPECTED = {"ddp": "ddp", "zero1": "zero", "zero2": "zero", "fsdp2": "fsdp", "hsdp1x1": "fsdp", "tp1": "ddp",
            "sdp_block": "sdp", "fp16_compression": "ddp", "bf16_compression": "ddp", "powersgd": "ddp",
            "onebit_compression": "ddp", "signsgd_compression": "ddp", "local_sgd": "local_sgd"}


def test_every_gpu_configuration_is_valid_and_selects_its_strategy():
    cases = matrix(steps=20, gpu=True)
    assert len(cases) == 2 * len(EXPECTED) * 2  # GPT and Llama, fp32 and bf16
    for name, data in cases + restart_pair(20, gpu=True):
        spec = parse_spec(data, allow_fault_injection=True)
        strategy = name.split("-")[1]
        assert strategy == "crash" or strategy == "twin" or strategy_name(spec) == EXPECTED[strategy], name


def test_the_cpu_dry_run_leaves_out_only_what_needs_nccl():
    names = {name.split("-")[1] for name, _ in matrix(steps=2, gpu=False)}
    assert names == set(EXPECTED) - NEEDS_NCCL


def test_the_checkpoint_row_times_a_real_async_save_against_a_sync_one(tmp_path):
    """bench/device_checkpoint.py on a tiny Llama (in its own process: it forms a world-size-1 group)."""
    code = ("import json, pathlib, sys; from bench.device_checkpoint import measure; "
            "print(json.dumps(measure('cpu', True, pathlib.Path(sys.argv[1]))))")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    m = json.loads(done.stdout.splitlines()[-1])
    assert m["params"] > 0 and 0 < m["blocked_s"] <= m["durable_s"] and m["sync_s"] > 0, m
    saved = sorted(p.name for p in (tmp_path / "async" / "checkpoints").iterdir())
    assert saved == ["step-00000001", "step-00000002"], saved  # both async saves became durable


def test_the_throughput_row_trains_the_same_model_both_ways(tmp_path):
    """bench/device_throughput.py's dry run: a tiny Llama through Trainyard's Trainer and through the plain
    loop, each in its own process; both train, and on the same model."""
    m = measure_throughput("cpu", True, tmp_path)
    assert m["micro_batch"] == 2 and m["seq"] == 64, m
    assert m["trainyard"]["params"] == m["plain"]["params"] > 0, m
    assert m["trainyard"]["tokens_per_s"] > 0 and m["plain"]["tokens_per_s"] > 0, m


def test_the_gpu_throughput_job_is_a_valid_bf16_ddp_job_of_350m_parameters():
    spec = parse_spec(trainyard_spec(LLAMA_350M, 16, 2048, 25, gpu=True))
    assert strategy_name(spec) == "ddp" and spec.parallel.mixed_precision == "bf16"
    assert spec.train.global_batch_size == spec.train.micro_batch_size == 16 and spec.data.seq_len == 2048
