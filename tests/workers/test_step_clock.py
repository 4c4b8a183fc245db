"""The step clock by device type: host time on CPU, CUDA events on GPU (timed on the device check)."""

from __future__ import annotations

import time

import torch

from workers.telemetry import CommMeter
from workers.training.step_clock import CudaEventClock, HostClock, clock_for


def test_the_clock_follows_the_device_type():
    assert isinstance(clock_for(torch.device("cpu")), HostClock)
    assert isinstance(clock_for(torch.device("cuda", 0)), CudaEventClock)  # built without touching CUDA


def test_host_clock_times_the_work_between_two_marks():
    clock = HostClock()
    start = clock.mark()
    time.sleep(0.02)
    assert 0.015 < clock.seconds(start, clock.mark()) < 1.0


def test_comm_meter_keeps_the_mark_of_the_latest_launch():
    clock = HostClock()
    meter = CommMeter(clock)
    meter.launched(10)
    first = meter.last_launch_mark
    meter.launched(20)
    assert meter.logical_bytes == 30 and isinstance(first, float) and meter.last_launch_mark > first
    meter.reset()
    assert meter.last_launch_mark is None and CommMeter().last_launch_mark is None
