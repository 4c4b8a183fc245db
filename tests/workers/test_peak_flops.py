"""MFU's peak FLOP/s: the table by device name, the override, and an honest unknown on CPU."""

from __future__ import annotations

import pytest
import torch

from workers.peak_flops import OVERRIDE_ENV, PEAK_FLOPS, lookup, peak_flops

T = 1e12


@pytest.mark.parametrize(("name", "half", "expected", "fragment"), [
    ("NVIDIA H100 80GB HBM3", True, 989.4 * T, "H100"),
    ("NVIDIA H100 PCIe", True, 756 * T, "H100 PCIE"),  # the longer fragment wins
    ("NVIDIA H200", True, 989.4 * T, "H200"),
    ("NVIDIA H200 NVL", False, 60 * T, "H200 NVL"),
    ("NVIDIA A100-SXM4-80GB", False, 19.5 * T, "A100"),
    ("NVIDIA L40S", True, 362.05 * T, "L40S"),
    ("NVIDIA A10G", True, 70 * T, "A10G"),
    ("NVIDIA B200", True, 2250 * T, "B200"),
])
def test_the_table_gives_the_dense_figure_of_the_named_gpu(name, half, expected, fragment):
    peak = lookup(name, half)
    assert peak.flops_per_s == pytest.approx(expected) and peak.source == f"table: {fragment}"


def test_every_gpu_of_the_issue_is_in_the_table_with_bf16_above_fp32():
    for gpu in ("H100", "H200", "A100", "L40S", "A10G", "B200"):
        bf16, fp32 = PEAK_FLOPS[gpu]
        assert bf16 > fp32 > 1e12, gpu


def test_an_unknown_gpu_and_a_cpu_are_unknown_and_say_why():
    gpu = lookup("NVIDIA GeForce GTX 1080", half=True)
    assert gpu.flops_per_s is None and "not in the peak FLOP/s table" in gpu.reason and OVERRIDE_ENV in gpu.reason
    cpu = peak_flops(torch.device("cpu"), half=False, environ={})
    assert cpu.flops_per_s is None and cpu.source == "unknown"
    assert "CPU worker" in cpu.reason and OVERRIDE_ENV in cpu.reason


def test_the_override_wins_on_any_device_and_a_bad_one_is_ignored():
    assert peak_flops(torch.device("cpu"), half=False, environ={OVERRIDE_ENV: "4e14"}).flops_per_s == 4e14
    assert peak_flops(torch.device("cpu"), half=False, environ={OVERRIDE_ENV: "0"}).flops_per_s is None
    assert peak_flops(torch.device("cpu"), half=False, environ={OVERRIDE_ENV: "fast"}).flops_per_s is None
