"""The device check's configurations (bench/device_cases.py) are valid specs that select the strategy they
name; `make device-check-dry` trains them (82 s, so not in `make test`)."""

from __future__ import annotations

from bench.device_cases import NEEDS_NCCL, matrix, restart_pair
from workers.parallel.registry import strategy_class
from workers.spec_loading import parse_spec

EXPECTED = {"ddp": "ddp", "zero1": "zero", "zero2": "zero", "fsdp2": "fsdp", "hsdp1x1": "fsdp", "tp1": "ddp",
            "sdp_block": "sdp", "fp16_compression": "ddp", "bf16_compression": "ddp", "powersgd": "ddp",
            "local_sgd": "local_sgd"}


def test_every_gpu_configuration_is_valid_and_selects_its_strategy():
    cases = matrix(steps=20, gpu=True)
    assert len(cases) == 2 * len(EXPECTED) * 2  # GPT and Llama, fp32 and bf16
    for name, data in cases + restart_pair(20, gpu=True):
        spec = parse_spec(data, allow_fault_injection=True)
        strategy = name.split("-")[1]
        assert strategy == "crash" or strategy == "twin" or strategy_class(spec).name == EXPECTED[strategy], name


def test_the_cpu_dry_run_leaves_out_only_what_needs_nccl():
    names = {name.split("-")[1] for name, _ in matrix(steps=2, gpu=False)}
    assert names == set(EXPECTED) - NEEDS_NCCL
