"""How much faster compiling a model's blocks could make its training step on this host, at most.

Regional compilation fuses what runs between the matrix products (norms, activations, residual adds,
the optimizer's arithmetic stays eager) and cuts Python dispatch; it leaves the matrix products and the
attention kernel to the same BLAS/oneDNN calls eager uses. So the eager step's time in those kernels
is a floor the compiled step cannot go below, and (step time) / (time in them) is the most any
compiler of the blocks could gain. Measured here with torch's profiler on one eager step of the
bench's model (one micro-batch, one thread, forward, backward, clip and AdamW, as one worker runs it): the kernels'
profiled time against the median unprofiled step.

Imported by bench/compile.py, which prints it beside each model's rows.
"""

from __future__ import annotations

import math
import statistics
import time

# The kernels compilation calls as eager does (extern kernels in inductor's generated code).
GEMM_AND_ATTENTION = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm",
                      "aten::_scaled_dot_product_flash_attention_for_cpu",
                      "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
                      "aten::_scaled_dot_product_attention_math", "aten::_efficient_attention_forward",
                      "aten::_efficient_attention_backward", "aten::_scaled_dot_product_flash_attention",
                      "aten::_scaled_dot_product_flash_attention_backward")


def gemm_share(spec, warmup: int = 5, steps: int = 10) -> float:
    """The fraction of an eager training step's CPU time spent in GEMM and attention kernels."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from workers.data import build_datasets
    from workers.data.batches import GlobalBatches
    from workers.models import build_model
    from workers.training.losses import LOSSES

    torch.set_num_threads(1)
    torch.manual_seed(spec.train.seed)
    train_set, _ = build_datasets(spec)
    inputs, targets = next(iter(GlobalBatches(train_set, spec.train.global_batch_size, spec.train.seed)
                                .rank_microbatches(0, 0, 1, spec.train.micro_batch_size)))
    model = build_model(spec)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.train.lr, foreach=False)
    loss_fn = LOSSES[spec.train.loss]

    def step() -> None:
        loss_fn(model(inputs), targets).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=False)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    walls = []
    for _ in range(steps):  # the step's own time, unprofiled: the profiler adds its cost to every op
        started = time.perf_counter()
        step()
        walls.append(time.perf_counter() - started)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    floor_us = sum(e.self_cpu_time_total for e in prof.key_averages() if e.key in GEMM_AND_ATTENTION) / steps
    return floor_us / 1e6 / statistics.median(walls)


def ceiling(share: float) -> float:
    """The most a compiler of the blocks could speed the step up: everything but the floor made free."""
    return 1.0 / share if share > 0 else math.inf
