"""CPU time of the thread that computes, and burning it: how a step's compute time is measured on CPU and
how an injected slow rank (fault kind `slow`) is made slower (workers/training/train_step.py)."""

from __future__ import annotations

import time

import torch


def cpu_clock() -> float:
    """CPU seconds of the computing thread: the training thread alone when torch computes on one
    thread (Ray's RPC threads, gloo's communication and async checkpoint threads are not compute,
    and on a busy host their share made clean ranks look slow); the whole process otherwise."""
    return time.thread_time() if torch.get_num_threads() == 1 else time.process_time()


def burn_cpu(seconds: float) -> None:
    end = cpu_clock() + seconds
    while cpu_clock() < end:
        pass


def busy_wait(seconds: float) -> None:
    # Burn CPU rather than sleep: a degraded node computes slowly, it does not idle.
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass
